"""Typed benchmark records and the one writer that renders them as markdown tables.

A benchmark emits one :class:`Run`, its :class:`Table` records and one :class:`Result` per figure (``--out FILE``:
JSON lines); ``_report.py FILE.jsonl`` prints them, ``--docs docs/benchmarks.md`` replaces a BEGIN/END section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    """One run of one benchmark: the exact command, when, where, and free-form notes."""

    bench: str
    command: str
    date: str
    machine: str
    load: str = ""
    wall_s: float = 0.0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Table:
    """A table of a run; each of ``ratios``, ``(numerator, denominator, header)``, adds a column, and
    so does each of ``differences``, ``(minuend, subtrahend, header)``, in the columns' unit."""

    bench: str
    key: str
    title: str
    row_header: str
    ratios: tuple[tuple[str, str, str], ...] = ()
    differences: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Result:
    """One figure: a cell of ``table`` in ``row`` and ``column``. ``value`` is the median of
    ``samples`` when there are samples. ``unit``: ``ns``, ``B`` (bytes), ``n`` (a count), ``x``."""

    bench: str
    table: str
    row: str
    column: str
    value: float
    unit: str
    samples: tuple[float, ...] = ()


RECORDS = {cls.__name__: cls for cls in (Run, Table, Result)}


def measured(bench: str, table: str, row: str, column: str, samples: Sequence[float], unit: str = "ns") -> Result:
    """A :class:`Result` whose value is the median of ``samples``."""
    return Result(bench, table, row, column, statistics.median(samples), unit, tuple(samples))


def slowest_and_paired(bench: str, table: str, ranks: Sequence[Sequence[dict]], series: Sequence[str]) -> list[Result]:
    """Per row and series the slowest rank's median, and the paired ratio ``series[0] / series[1]`` (per rank
    the median over repetitions, the largest over ranks); ``ranks``: per rank ``[{"row", "samples": {series: ns}}]``."""
    out = []
    for configs in zip(*ranks):
        row = configs[0]["row"]
        for name in series:
            out.append(measured(bench, table, row, name, max((c["samples"][name] for c in configs),
                                                             key=statistics.median)))
        paired = max(statistics.median(o / b for o, b in zip(c["samples"][series[0]], c["samples"][series[1]]))
                     for c in configs)
        out.append(Result(bench, table, row, f"paired {series[0]} / {series[1]}", paired, "x"))
    return out


def write(path: Path | None, records: Iterable[Run | Table | Result]) -> None:
    """Print the rendered tables; with ``path``, also write the records there as JSON lines."""
    records = list(records)
    print(render(records))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"type": type(r).__name__, **dataclasses.asdict(r)}) for r in records]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def load(paths: Iterable[Path]) -> list[Run | Table | Result]:
    """The records written by :func:`write`, in order."""
    out = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            fields = json.loads(line)
            cls = RECORDS[fields.pop("type")]
            out.append(cls(**{k: _tuples(v) for k, v in fields.items()}))
    return out


def _three(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def fmt(value: float, unit: str) -> str:
    if unit == "ns":
        scale, name = next(((s, n) for s, n in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")) if abs(value) >= s), (1, "ns"))
        return f"{_three(value / scale)} {name}"
    if unit == "B":
        scale, name = next(((s, n) for s, n in ((1 << 20, "MB"), (1 << 10, "KB")) if value >= s), (1, "B"))
        return f"{value / scale:.1f} {name}" if scale > 1 else f"{value:.0f} B"
    if unit == "x":
        return f"{value:,.0f}×" if value >= 100 else f"{value:.1f}×" if value >= 10 else f"{value:.3f}×"
    return f"{value:,.0f}"


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table with padded cells (readable as plain text); the first column left-aligned."""
    widths = [max(3, len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "| " + " | ".join(":" + "-" * (w - 1) if i == 0 else "-" * (w - 1) + ":"
                             for i, w in enumerate(widths)) + " |"
    return "\n".join([line(headers), rule, *map(line, rows)])


def render_table(table: Table, results: Sequence[Result]) -> str:
    rows = list(dict.fromkeys(r.row for r in results))
    columns = list(dict.fromkeys(r.column for r in results))
    cell = {(r.row, r.column): r for r in results}
    body = []
    for row in rows:
        cells = [row] + [fmt(cell[row, c].value, cell[row, c].unit) if (row, c) in cell else "" for c in columns]
        pairs = [(cell.get((row, n)), cell.get((row, d))) for n, d, _ in table.ratios]
        cells += [fmt(a.value / b.value, "x") if a and b and b.value else "" for a, b in pairs]
        pairs = [(cell.get((row, n)), cell.get((row, d))) for n, d, _ in table.differences]
        body.append(cells + [fmt(a.value - b.value, a.unit) if a and b else "" for a, b in pairs])
    headers = [table.row_header, *columns, *(header for _, _, header in (*table.ratios, *table.differences))]
    return f"### {table.title}\n\n{markdown(headers, body)}"


def render(records: Sequence[Run | Table | Result]) -> str:
    """Every run in ``records``: its header lines, then its tables in the order they were declared."""
    parts = []
    for run in (r for r in records if isinstance(r, Run)):
        header = (f"Run of `{run.command}` ({run.date}; {run.wall_s:.0f} s): {run.machine}; "
                  f"load average (1 min) at start / end {run.load}.")
        parts.append("\n".join([header, *(f"- {note}" for note in run.notes)]))
        for table in (r for r in records if isinstance(r, Table) and r.bench == run.bench):
            results = [r for r in records if isinstance(r, Result) and (r.bench, r.table) == (run.bench, table.key)]
            parts.append(render_table(table, results))
    return "\n\n".join(parts)


def replace_section(docs: Path, name: str, text: str) -> None:
    """Put ``text`` between the ``BEGIN name`` / ``END name`` markers of ``docs`` (which must exist)."""
    old = docs.read_text(encoding="utf-8")
    pattern = re.compile(rf"(<!-- BEGIN {re.escape(name)}\b[^>]*-->\n).*?(\n<!-- END {re.escape(name)} -->)", re.DOTALL)
    if not pattern.search(old):
        raise SystemExit(f"{docs} has no <!-- BEGIN {name} --> ... <!-- END {name} --> markers")
    docs.write_text(pattern.sub(lambda m: m[1] + text + m[2], old, count=1), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="JSON-lines files written by a benchmark's --out")
    p.add_argument("--docs", type=Path, help="rewrite each benchmark's section of this markdown file")
    args = p.parse_args(argv)
    for path in args.files:  # one run per file; a later file of the same benchmark wins
        records = load([path])
        if args.docs:
            replace_section(args.docs, next(r.bench for r in records if isinstance(r, Run)), render(records))
        else:
            print(render(records) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
