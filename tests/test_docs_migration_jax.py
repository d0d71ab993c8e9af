"""docs/migration_jax.md, checked row by row.

- Every ``fm.`` name in the page's tables exists, and every JAX feature whose row says "none" has
  no counterpart in ``fm`` (so the page cannot keep saying "none" after one is added).
- The JAX column of "Same program, same numbers" runs in JAX itself (the oracle's venv: JAX
  0.12.0.1, or the 0.10.2 fallback; 8 CPU devices) and gives the types and values the page states.
  Our column of the same table runs on 8 gloo workers in tests/dist/test_recipes_gloo.py, against
  the same expected cells.

The parsing helpers here are shared with that module.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
from pathlib import Path

import pytest

import functional_mesh as fm
from tests.jax_oracle._jax_venv import jax_python  # noqa: F401  (a session fixture: the JAX venv)

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "migration_jax.md"
NUMBERS = "### Same program, same numbers"
RUN_MARK = "# torchrun --nproc_per_node=8"
DEVICES = 8


def tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """Every Markdown table of ``text``: (the heading it sits under, its body rows as cells)."""
    out, heading, rows = [], "", None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.strip()
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if rows is None:
                rows = [cells]
            elif not set("".join(cells)) <= set(":- |"):
                rows.append(cells)
            continue
        if rows is not None:
            out.append((heading, rows))
            rows = None
    if rows is not None:
        out.append((heading, rows))
    return out


def code(cell: str) -> str:
    """The first code span of a cell."""
    match = re.search(r"`([^`]+)`", cell)
    assert match, f"no code in cell {cell!r}"
    return match.group(1)


def expected_per_device(cell: str) -> list:
    """A cell of the values column: a list with one entry per device, or "`x` on every device"."""
    value = ast.literal_eval(code(cell))
    if cell.endswith("on every device"):
        return [value] * DEVICES
    assert isinstance(value, list) and len(value) == DEVICES, f"{cell!r} lists {len(value)} devices"
    return value


def expected_varying(cell: str) -> list[str]:
    return [] if cell == "none" else sorted(a.strip() for a in cell.split(","))


def plain(value):
    """A result as the page writes it: a one-element result is its number."""
    if isinstance(value, list) and len(value) == 1 and not isinstance(value[0], list):
        return value[0]
    return value


def numbers_rows() -> list[tuple[str, str, list[str], list]]:
    """(JAX expression, our expression, varying axes, per-device values) for every row of the table."""
    (rows,) = [rows for heading, rows in tables(PAGE.read_text()) if heading == NUMBERS]
    assert rows[0] == ["JAX", "functional_mesh", "varies over", "on devices 0..7"], rows[0]
    return [(code(j), code(ours), expected_varying(v), expected_per_device(vals)) for j, ours, v, vals in rows[1:]]


def torchrun_blocks(page: Path) -> list[str]:
    """The fenced blocks of ``page`` whose first line is the torchrun mark, as code."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    return [b for b in blocks if b.startswith(RUN_MARK)]


# -- every name in the tables -----------------------------------------------------------------

def _resolve(dotted: str):
    value = fm
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _mapping_rows() -> list[list[str]]:
    return [row for _, rows in tables(PAGE.read_text()) if rows[0][:2] in (["JAX", "functional_mesh"],
                                                                          ["JAX (`jax.lax`)", "functional_mesh"])
            for row in rows[1:]]


def test_every_fm_name_in_the_tables_exists():
    names = {m.group(1) for row in _mapping_rows() for m in re.finditer(r"\bfm\.((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)", row[1])}
    assert len(names) > 20, sorted(names)
    missing = []
    for name in sorted(names):
        try:
            _resolve(name)
        except AttributeError:
            missing.append(f"fm.{name}")
    # and the attributes of our values the rows use: mesh.ranks, sh.local_slices, rm.device_mesh, ...
    owners = {"mesh": fm.Mesh, "sh": fm.NamedSharding, "rm": fm.RealizedMesh}
    used = {(m.group(1), m.group(2)) for row in _mapping_rows()
            for m in re.finditer(r"\b(mesh|sh|rm)\.([A-Za-z_]\w*)", row[1])}
    assert len(used) > 10, sorted(used)
    missing += [f"{owner}.{attr}" for owner, attr in sorted(used) if not hasattr(owners[owner], attr)]
    assert not missing, f"docs/migration_jax.md names {missing}, which do not exist"


def _params(f) -> set[str]:
    return set(inspect.signature(f).parameters)


# The JAX features the page says we lack (keyed by the first code span of the row's JAX cell),
# each with the check that we still lack it. A new "none" row needs an entry here.
ABSENT = {
    "mesh.axis_types": lambda: not hasattr(fm.Mesh, "axis_types") and not hasattr(fm, "AxisType"),
    "P.UNCONSTRAINED": lambda: not hasattr(fm.P, "UNCONSTRAINED"),
    "axis_index_groups=": lambda: all("axis_index_groups" not in _params(getattr(fm, c))
                                      for c in ("psum", "pmean", "all_gather", "psum_scatter", "all_to_all")),
    "pshuffle": lambda: not hasattr(fm, "pshuffle"),
}


def test_every_none_row_is_still_true():
    nones = [code(row[0]) for row in _mapping_rows() if row[1] == "none"]
    assert len(nones) >= 4, nones  # the parser finds them (4 since fm.shard_map(axis_names=) exists)
    unknown = [n for n in nones if n not in ABSENT]
    assert not unknown, f"add a check to ABSENT for the 'none' rows {unknown}"
    stale = [n for n in nones if not ABSENT[n]()]
    assert not stale, f"docs/migration_jax.md says 'none' for {stale}, but fm has it now: write its row"
    assert set(ABSENT) <= set(nones), f"checks for rows the page no longer has: {set(ABSENT) - set(nones)}"


def test_the_table_parsers_read_what_the_page_means():
    rows = numbers_rows()
    assert len(rows) >= 15
    by_ours = {ours: (vary, values) for _, ours, vary, values in rows}
    assert by_ours['fm.psum(v, ("x", "y"))'] == ([], [28] * 8)
    assert by_ours['fm.axis_index("y")'] == (["y"], [0, 1] * 4)
    assert by_ours['fm.all_gather(v, "y", to="invariant")'][0] == ["x"]
    assert plain([3.0]) == 3.0 and plain([[0.0], [1.0]]) == [[0.0], [1.0]] and plain([0.0, 1.0]) == [0.0, 1.0]
    assert len(torchrun_blocks(PAGE)) >= 1


# -- the JAX column, in JAX --------------------------------------------------------------------

_JAX_SCRIPT = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, PartitionSpec as P

mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto, AxisType.Auto))

def varying(r):
    aval = jax.typeof(r)
    return sorted(aval.manual_axis_type.varying if hasattr(aval, "manual_axis_type") else aval.vma)

out = {}
for expr in json.loads(sys.stdin.read()):
    seen = {}
    def f(v):
        r = jnp.asarray(eval(expr))
        seen["varying"] = varying(r)
        missing = tuple(a for a in ("x", "y") if a not in seen["varying"])
        return (lax.pcast(r, missing, to="varying") if missing else r)[None]
    result = jax.shard_map(f, mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y")))(jnp.arange(8.0))
    out[expr] = [seen["varying"], [block.tolist() for block in result]]
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_the_jax_column_gives_the_stated_types_and_values(jax_python):  # noqa: F811
    rows = numbers_rows()
    proc = subprocess.run([str(jax_python), "-c", _JAX_SCRIPT], input=json.dumps([r[0] for r in rows]),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = []
    for jax_expr, _, vary, values in rows:
        jax_vary, jax_values = got[jax_expr]
        if jax_vary != vary or [plain(v) for v in jax_values] != values:
            wrong.append(f"{jax_expr}: JAX gives {jax_vary} {[plain(v) for v in jax_values]}, the page says {vary} {values}")
    assert not wrong, "\n".join(wrong)
