"""Pictures of meshes and shardings, as plain strings (pure: no torch)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from . import _layout as L
from ._errors import MeshError, requires, unknown_axis
from ._mesh import Mesh, axis_layouts, family_modes
from ._reshard_plan import ReshardPlan
from ._sharding import NamedSharding, global_shape_of
from ._validate import as_int

__all__ = ["visualize", "visualize_sharding"]

# Six readable ANSI foreground colors, cycled by group or block index.
_COLORS = ("31", "32", "33", "34", "35", "36")
_RESET = "\x1b[0m"
MAX_SHARDING_DEVICES = 2**22
MAX_PLAN_DEVICES = 2**16  # a plan's picture lists every move


def _letters(i: int) -> str:
    """0 -> a, 25 -> z, 26 -> aa: a short, unbounded group label."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(ord("a") + r) + out
    return out


def _shown(n: int, limit: int) -> list[int | None]:
    """Indices 0..n-1 to draw, eliding the middle (``None``) when more than ``limit``."""
    if n <= limit:
        return list(range(n))
    head = max(limit - 1, 1)
    return [*range(head), None, n - 1]


def _paint(text: str, index: int | None, color: bool) -> str:
    if not color or index is None:
        return text
    return f"\x1b[{_COLORS[index % len(_COLORS)]}m{text}{_RESET}"


def _table(row_labels: Sequence[str], col_labels: Sequence[str],
           cells: Sequence[Sequence[tuple[str, int | None]]], color: bool) -> list[str]:
    """Left-aligned columns; each cell is (text, color index). Padding is computed on plain text."""
    width = max([len(t) for row in cells for t, _ in row] + [len(c) for c in col_labels] + [1])
    left = max([len(r) for r in row_labels] + [0])
    head = (" " * left + "  " + "  ".join(c.ljust(width) for c in col_labels)).rstrip()
    lines = [head] if head else []
    for label, row in zip(row_labels, cells, strict=True):
        body = "  ".join(_paint(t, k, color) + " " * (width - len(t)) for t, k in row)
        lines.append((label.ljust(left) + "  " + body).rstrip())
    return lines


def _cells(rows: Sequence[int | None], cols: Sequence[int | None],
           cell: Callable[[int, int], tuple[str, int | None]]) -> list[list[tuple[str, int | None]]]:
    """The table body: ``cell(i, j)`` for drawn rows and columns, ``…`` where one was elided."""
    return [[("…", None) if i is None or j is None else cell(i, j) for j in cols] for i in rows]


def _check_flags(api: str, color: object, limit: object) -> int:
    if not isinstance(color, bool):
        raise TypeError(requires(api, "a bool for color", "color", color))
    limit = as_int(api, "max_side", limit)
    if limit < 2:
        raise MeshError(requires(api, "max_side >= 2 (rows, columns, pages and groups drawn)", "max_side", limit))
    return limit


def visualize(mesh: Mesh | ReshardPlan, axis: str | None = None, *, color: bool = False, max_side: int = 16) -> str:
    """The rank grid of ``mesh`` and the groups of each axis, as a string; or who sends what to whom in a plan.

    Args:
        mesh: any mesh, including a family (``mesh["tp"]``: one page per group); or a
            :class:`~functional_mesh.ReshardPlan`, drawn as a table of moves per stage (docs/across_meshes.md).
        axis: an axis whose groups to mark: each rank gets its group's letter (``a``, ``b``,
            ...; the order of ``mesh[axis].groups()``).
        color: add ANSI colors (one per group of ``axis``); for terminals only.
        max_side: at most this many rows, columns, pages and groups per axis are drawn; the
            middle ones are elided with ``…``.

    Returns:
        The picture: a header line, one page per group and leading coordinate (rows over the
        next-to-last axis, columns over the last), then each axis's groups.

    Raises:
        UnknownAxisError: an ``axis`` that the mesh lacks.
        MeshError: ``max_side`` below 2, an ``axis`` with a plan, or a plan whose destination has more than
            ``2**16`` devices (every move is listed).
        TypeError: a ``mesh`` that is not a ``Mesh`` or ``ReshardPlan``, or a ``color`` that is not a bool.

    Examples:
        >>> print(fm.visualize(fm.make_mesh((2, 2), ("dp", "tp"))["tp"]))
        Mesh(tp=2; 2 groups over devices 0..3): 4 devices
        group 0
          tp=0  tp=1
          0     1
        group 1
          tp=0  tp=1
          2     3
        groups of each axis:
          tp  size 2, 2 groups: [0 1] [2 3]
    """
    api = "visualize"
    if isinstance(mesh, ReshardPlan):
        limit = _check_flags(api, color, max_side)
        if axis is not None:
            raise MeshError(requires(api, "no axis= with a ReshardPlan (its picture is a table of moves)", "axis", axis))
        return _plan_picture(mesh, color, limit)
    if not isinstance(mesh, Mesh):
        raise TypeError(requires(api, "a functional_mesh.Mesh", "mesh", mesh))
    limit = _check_flags(api, color, max_side)
    if axis is not None and axis not in mesh.axis_names:
        raise unknown_axis(api, axis, mesh.axis_names, mesh)
    sizes, names = mesh.axis_sizes, mesh.axis_names
    # Only the drawn cells are computed (O(cells drawn), whatever the world size).
    family = mesh[axis] if axis is not None else None
    header = f"{mesh!r}: {mesh.num_devices} device{'s' if mesh.num_devices != 1 else ''}"
    if axis is not None:
        header += f", letters mark the groups of {axis}"
    lines = [header]
    lead = sizes[:-2] if len(sizes) > 2 else ()
    pages = mesh.num_groups * math.prod(lead)
    for page in _shown(pages, limit):
        if page is None:
            lines.append(f"… {pages - limit} more pages …")
            continue
        g, rest = divmod(page, math.prod(lead))
        coords = tuple(int(c) for c in np.unravel_index(rest, lead)) if lead else ()
        label = [f"group {g}"] if mesh.num_groups > 1 else []
        label += [f"{n}={c}" for n, c in zip(names[:len(lead)], coords, strict=True)]
        if label:
            lines.append(", ".join(label))
        lines += _page(mesh, g, coords, family, color, limit)
    lines.append("groups of each axis:" if names else "no axes: one device per group" if mesh.num_groups > 1
                 else "no axes: one device, no groups")
    width = max(len(n) for n in names) if names else 0
    for n, s in zip(names, sizes, strict=True):
        family = mesh[n]
        shown = []
        for i in _shown(family.num_groups, limit):
            if i is None:
                shown.append(f"… {family.num_groups - limit} more")
                continue
            text = "[" + " ".join("…" if m is None else str(_rank_at(family, i, (m,))) for m in _shown(s, limit)) + "]"
            if n == axis:
                text = f"{_letters(i)}={text}"
            shown.append(_paint(text, i if n == axis else None, color))
        count = f"{family.num_groups} group{'s' if family.num_groups != 1 else ''}"
        lines.append(f"  {n.ljust(width)}  size {s}, {count}: " + " ".join(shown))
    return "\n".join(lines)


def _plan_picture(plan: ReshardPlan, color: bool, limit: int) -> str:
    """Each stage's moves (sender -> receiver, index, bytes; a local copy marked) and the plan's figures."""
    n = len(plan.dst_ranks)
    if n > MAX_PLAN_DEVICES:
        raise MeshError(requires("visualize", f"a plan onto at most {MAX_PLAN_DEVICES:,} devices (every move is "
                                              "listed)", "len(plan.dst_ranks)", n))
    moves = plan.moves
    lines = [repr(plan)]
    rows_per_stage = 4 * limit
    for stage in range(plan.stages):
        these = [m for m in moves if m.stage == stage]
        lines.append(f"stage {stage}: {len(these)} move{'s' if len(these) != 1 else ''}")
        shown = these if len(these) <= rows_per_stage else these[:rows_per_stage - 1]
        cells = [(f"{m.src_rank} -> {m.dst_rank}", ", ".join(_block_label(s) for s in m.index) or "()",
                  f"{m.nbytes} bytes" + (" (local copy)" if m.src_rank == m.dst_rank else ""), m.src_rank)
                 for m in shown]
        widths = [max([len(c[0]) for c in cells] + [0]), max([len(c[1]) for c in cells] + [0])]
        for who, where, size, sender in cells:
            lines.append("  " + _paint(who.ljust(widths[0]), sender, color) + "  " + where.ljust(widths[1]) + "  " + size)
        if len(shown) < len(these):
            lines.append(f"  … {len(these) - len(shown)} more moves")
    lines.append(f"bytes_moved {plan.bytes_moved}, max_send_bytes {plan.max_send_bytes}, moves {len(moves)}, "
                 f"stages {plan.stages}")
    return "\n".join(lines)


def _rank_at(mesh: Mesh, group: int, coord: Sequence[int]) -> int:
    """The global rank at ``coord`` of group ``group`` (torch's group order), in O(modes)."""
    pos = L.modes_value(family_modes(mesh), group)
    pos += sum(L.modes_value(lay.modes, c) for lay, c in zip(axis_layouts(mesh), coord, strict=True))
    return int(mesh.device_list.take(np.asarray(pos, dtype=np.int64)))


def _group_index(family: Mesh, rank: int) -> int:
    """Which group of ``family`` holds ``rank`` (the inverse of the group part of :func:`_rank_at`)."""
    position = family.device_list.index_of(rank)
    assert position is not None  # a rank of the family
    return L.digits_value(family_modes(family), position)


def _page(mesh: Mesh, group: int, lead: tuple[int, ...], family: Mesh | None, color: bool, limit: int) -> list[str]:
    """One 2-D page: rows over the next-to-last axis, columns over the last (fewer axes: one row/cell)."""
    names, sizes = mesh.axis_names[len(lead):], mesh.axis_sizes[len(lead):]
    shape = (1,) * (2 - len(sizes)) + sizes
    row_name = names[-2] if len(names) == 2 else None
    col_name = names[-1] if names else None
    rows, cols = _shown(shape[0], limit), _shown(shape[1], limit)
    col_labels = ["…" if j is None else (f"{col_name}={j}" if col_name else "") for j in cols]
    row_labels = ["…" if i is None else (f"{row_name}={i}" if row_name else "") for i in rows]
    def cell(i: int, j: int) -> tuple[str, int | None]:
        rank = _rank_at(mesh, group, lead + (i, j)[2 - len(sizes):])
        mark = _group_index(family, rank) if family is not None else None
        return f"{rank}{_letters(mark) if mark is not None else ''}", mark

    return _table(row_labels, col_labels, _cells(rows, cols, cell), color)


def _block_label(s: slice) -> str:
    return f"{s.start}:{s.stop}"


def _ravel(coords: Sequence[int], sizes: Sequence[int]) -> int:
    """Row-major index of ``coords`` (first axis major, as a spec tuple splits)."""
    index = 0
    for c, n in zip(coords, sizes, strict=True):
        index = index * n + c
    return index


def _iter_ranks(ranks: list[int], limit: int) -> Iterator[str]:
    if len(ranks) <= limit:
        yield from map(str, ranks)
        return
    yield from map(str, ranks[: limit - 1])
    yield f"+{len(ranks) - limit + 1}"


def visualize_sharding(sharding: NamedSharding, global_shape: Sequence[int], *, color: bool = False,
                       max_side: int = 16) -> str:
    """Which ranks hold which block of a tensor of ``global_shape``, as a string.

    Rows are the blocks of the leading dims, columns the blocks of the last dim (a 1-D tensor
    has one row, a 0-D tensor one cell); each cell lists the ranks holding that block. Uneven
    dims follow DTensor's ``torch.chunk`` rule and show their short and empty tail blocks.

    Args:
        sharding: the ``NamedSharding``.
        global_shape: the full tensor's shape.
        color: add ANSI colors (one per block); for terminals only.
        max_side: at most this many block rows/columns and ranks per cell are drawn.

    Returns:
        The picture: a header, how each split dim divides, then the table of blocks.

    Raises:
        MeshError: a shape the spec does not fit, ``max_side`` below 2, or a mesh of more than
            ``2**22`` devices (every holder of every block is listed).
        TypeError: a ``sharding`` that is not a ``NamedSharding``, or a bad shape or ``color``.

    Examples:
        >>> print(fm.visualize_sharding(fm.NamedSharding(fm.make_mesh((2, 2), ("dp", "tp")), fm.P("tp")), (3,)))
        NamedSharding(Mesh(dp=2, tp=2), P('tp')) of shape (3,): shard shape (2,)
        dim 0 splits 3 over tp=2 into 2, 1 (uneven)
          0:2  2:3
          0 2  1 3
    """
    api = "visualize_sharding"
    if not isinstance(sharding, NamedSharding):
        raise TypeError(requires(api, "a functional_mesh.NamedSharding", "sharding", sharding))
    limit = _check_flags(api, color, max_side)
    shape = global_shape_of(sharding, api, global_shape)
    mesh, spec = sharding.mesh, sharding.spec
    if mesh.num_devices > MAX_SHARDING_DEVICES:  # it lists every rank's block: O(devices)
        raise MeshError(requires(api, f"a mesh of at most {MAX_SHARDING_DEVICES:,} devices (every holder of every "
                                      "block is listed)", "num_devices", mesh.num_devices), mesh=mesh)
    dim_axes = [spec.axes_of(d) if d < len(spec) else () for d in range(len(shape))]
    # Key each rank's block by its shard index along every dim (first axis major), not by its
    # slices: two empty tail shards have equal slices but are different shards.
    by_block: dict[tuple[int, ...], list[int]] = {}
    slices_of: dict[tuple[int, ...], tuple[slice, ...]] = {}
    for rank, slices in sorted(sharding.devices_indices_map(shape).items()):
        coordinate = mesh.coordinate(rank)
        assert coordinate is not None  # a rank of the mesh's own devices
        coord = dict(zip(mesh.axis_names, coordinate, strict=True))
        key = tuple(_ravel([coord[a] for a in axes], [mesh.axis_size(a) for a in axes]) for axes in dim_axes)
        by_block.setdefault(key, []).append(rank)
        slices_of[key] = slices
    lines = [f"{sharding!r} of shape {shape}: shard shape {sharding.shard_shape(shape)}"]
    for d, (n, axes) in enumerate(zip(shape, dim_axes, strict=True)):
        if axes:
            pieces = {key[d]: slices_of[key][d] for key in slices_of}
            lengths = [pieces[i].stop - pieces[i].start for i in sorted(pieces)]
            uneven = " (uneven)" if len(set(lengths)) > 1 else ""
            lines.append(f"dim {d} splits {n} over {'×'.join(axes)}={len(pieces)} into "
                         f"{', '.join(map(str, lengths))}{uneven}")
    lead_keys = sorted({key[:-1] for key in by_block})
    last_keys = sorted({key[-1:] for key in by_block})
    index = {key: i for i, key in enumerate(sorted(by_block))}
    rows, cols = _shown(len(lead_keys), limit), _shown(len(last_keys), limit)

    def label(key: tuple[int, ...], dims: range) -> str:
        sample = next(k for k in slices_of if k[dims.start:dims.stop] == key)
        return ", ".join(_block_label(slices_of[sample][d]) for d in dims)

    lead_dims, last_dims = range(max(len(shape) - 1, 0)), range(max(len(shape) - 1, 0), len(shape))
    row_labels = ["…" if i is None else label(lead_keys[i], lead_dims) for i in rows]
    col_labels = ["…" if j is None else label(last_keys[j], last_dims) for j in cols]
    def cell(i: int, j: int) -> tuple[str, int | None]:
        key = lead_keys[i] + last_keys[j]
        return " ".join(_iter_ranks(by_block.get(key, []), limit)) or "-", index.get(key)

    lines += _table(row_labels, col_labels, _cells(rows, cols, cell), color)
    return "\n".join(lines)
