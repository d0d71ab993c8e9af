"""Command line: ``python -m functional_mesh show "dp=2,cp=2,tp=2"`` (or ``functional-mesh show ...``), and ``plan``.

Prints a mesh's rank grid and the groups of each axis, after optional transformations applied
in the order given, and optionally where its axes sit on hosts and how a sharding places a
tensor's blocks; ``plan`` prints who sends which block to whom to reshard between two meshes
(``fm.plan_reshard``). Pure: it never imports torch. Bad arguments exit with status 2 and a message
naming the bad value.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from collections.abc import Mapping, Sequence

from ._errors import MeshError
from ._mesh import Mesh, make_mesh
from ._order import mesh_from_order
from ._reshard_plan import plan_reshard
from ._sharding import NamedSharding, P
from ._visualize import visualize, visualize_sharding

EXAMPLES = """\
examples:
  functional-mesh show "dp=2,cp=2,tp=2"
  functional-mesh show "dp=2,cp=2,tp=2" --axis tp --ranks-per-host 4
  functional-mesh show "dp=2,cp=2,tp=2" --select tp,dp
  functional-mesh show "dp=2,cp=2,tp=2" --flatten dp,cp:dp_cp
  functional-mesh show "world=8" --unflatten world:dp=2,tp=4 --transpose tp,dp
  functional-mesh show "dp=2,tp=4" --devices 8-15 --rename dp=data
  functional-mesh show "pp=4,tp=2" --take pp=0,3                    # the first and last stage
  functional-mesh show "dp=2,cp=2,tp=2" --take dp=1 --take tp=::-1
  functional-mesh show "dp=2,cp=2,tp=2" --spec "('dp','cp'),None" --shape 8,6
  functional-mesh show "tp=2,cp=2,dp=2,pp=2" --order tp-cp-dp-pp     # Megatron order string

Transformations (--select, --flatten, --unflatten, --transpose, --rename, --take) apply in the
order given. --take AXIS=INDEX is mesh.take: an int (negative counts from the end) drops the axis,
keeping that position; START:STOP[:STEP] or comma-separated ints ("0,3", or "2," for one) keep it.
Hosts hold --ranks-per-host consecutive ranks (torchrun's numbering).
"""


EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: how a shell reports a tool that the end of its pipe closed


PLAN_EXAMPLES = """\
examples:
  functional-mesh plan --src "dp=2,tp=2" --src-spec "None,tp" --dst "tp=4@4" --dst-spec "None,tp" --shape 8,8
  functional-mesh plan --src "dp_shard=2,tp=2" --src-spec "dp_shard,tp" --dst "dp=4,tp=2@4" --dst-spec "None,tp" \\
      --shape 8,8 --dtype bfloat16
  functional-mesh plan --src "x=4" --src-spec x --dst "x=4" --dst-devices 3,2,1,0 --dst-spec x --shape 8 --no-relays

A mesh is name=size items, outermost first, with an optional @START: its devices are START..START+N-1
(default 0). --src-devices / --dst-devices give the ranks instead ("8-15", "3,2,1,0": a permuted list).
A spec is written as for show --spec ("None,tp", "('dp','cp'),None"; default: replicated).
"""


class _Transform(argparse.Action):
    """Collect transformations in command-line order into ``namespace.ops``."""

    def __call__(self, parser, namespace, values, option_string=None):
        ops = list(getattr(namespace, "ops", None) or [])
        ops.append((self.dest, values))
        namespace.ops = ops


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="functional-mesh", description="See device meshes as values.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    show = commands.add_parser(
        "show", help="print a mesh's rank grid, its groups, host span and a sharding",
        description="Print a mesh's rank grid and the groups of each axis.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("mesh", help='axis sizes, outermost first: "dp=2,cp=2,tp=2"')
    show.add_argument("--devices", help='global ranks: "8-15", "0,2,4,6" or "0-3,8-11" (default 0..N-1)')
    show.add_argument("--order", help='a Megatron order string, leftmost fastest: "tp-cp-ep-dp-pp"; '
                                      "MESH then gives the sizes in any order")
    for name, meta, text in [
        ("select", "A,B", "keep these axes, in this order (mesh[A, B])"),
        ("flatten", "A,B[:NAME]", "merge these axes into one (row-major in the listed order)"),
        ("unflatten", "AXIS:a=2,b=4", "split an axis into new axes"),
        ("transpose", "A,B,...", "reorder all axes"),
        ("rename", "OLD=NEW,...", "rename axes (simultaneously)"),
        ("take", "AXIS=INDEX", "keep positions along an axis: 1 (drops it), 1:3, ::-1 or 0,3 (mesh.take)"),
    ]:
        show.add_argument(f"--{name}", dest=name, metavar=meta, action=_Transform, help=text)
    show.add_argument("--axis", help="mark the groups of this axis with letters in the grid")
    show.add_argument("--ranks-per-host", type=_positive, metavar="K",
                      help="say per axis whether its groups stay inside a host of K consecutive ranks")
    show.add_argument("--spec", help="a PartitionSpec, e.g. \"('dp','cp'),None\" or \"dp,None\" (needs --shape)")
    show.add_argument("--shape", help='the global tensor shape for --spec, e.g. "8,6"')
    show.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                      help="ANSI colors: auto = only on a terminal and without NO_COLOR")
    show.add_argument("--max-side", type=_positive, default=16, metavar="N",
                      help="draw at most N rows, columns, pages and groups (default 16)")
    plan = commands.add_parser(
        "plan", help="print who sends which block to whom to reshard between two meshes",
        description="Print the plan of a reshard from --src/--src-spec to --dst/--dst-spec (fm.plan_reshard).",
        epilog=PLAN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    for side in ("src", "dst"):
        plan.add_argument(f"--{side}", required=True, metavar="MESH", help='axis sizes and offset: "dp=2,tp=2@8"')
        plan.add_argument(f"--{side}-spec", default="", metavar="SPEC", help='a PartitionSpec: "None,tp"')
        plan.add_argument(f"--{side}-devices", metavar="RANKS", help='explicit ranks instead of @START: "3,2,1,0"')
    plan.add_argument("--shape", required=True, help='the global tensor shape, e.g. "8,8"')
    plan.add_argument("--dtype", default="float32", help="a dtype name (default float32)")
    plan.add_argument("--no-relays", dest="relays", action="store_false",
                      help="every move from a source holder in stage 0 (no forwarding among destination replicas)")
    plan.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                      help="ANSI colors: auto = only on a terminal and without NO_COLOR")
    plan.add_argument("--max-side", type=_positive, default=16, metavar="N",
                      help="list at most 4 N moves per stage (default 16)")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def _names(text: str, what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(","))
    if not text.strip() or any(not n for n in names):
        raise MeshError(f"{what} requires comma-separated axis names, but got {text!r}")
    return names


def _sizes(text: str, what: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for item in text.split(","):
        name, sep, size = item.partition("=")
        name, size = name.strip(), size.strip()
        if not sep or not name or not re.fullmatch(r"-?\d+", size):
            raise MeshError(f'{what} requires name=size items like "dp=2,tp=4", but got {item!r} in {text!r}')
        if name in sizes:
            raise MeshError(f"{what} requires distinct axis names, but got {name!r} twice in {text!r}")
        sizes[name] = int(size)
    return sizes


def _devices(text: str) -> list[int]:
    out: list[int] = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if not m:
            raise MeshError(f'--devices requires ranks or inclusive ranges like "8-15" or "0,2,4", but got {item!r}')
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise MeshError(f"--devices requires ranges with start <= end, but got {item!r}")
        out.extend(range(lo, hi + 1))
    return out


def _index(text: str, value: str) -> int | slice | list[int]:
    """``--take``'s INDEX: ``3`` or ``-1`` (an int), ``1:3`` or ``::-1`` (a slice), ``0,3`` or ``2,`` (a list)."""
    integer = r"\s*-?\d+\s*"
    if re.fullmatch(integer, text):
        return int(text)
    if re.fullmatch(rf"(?:{integer})?:(?:{integer})?(?::(?:{integer})?)?", text):
        return slice(*(int(p) if p.strip() else None for p in text.split(":")))
    items = text.split(",")
    if "," in text and all(re.fullmatch(integer, p) for p in (items[:-1] if not items[-1].strip() else items)):
        return [int(p) for p in items if p.strip()]
    raise MeshError(f'--take requires an int, START:STOP[:STEP] or comma-separated ints after AXIS=, '
                    f'but got {text!r} in {value!r}')


def _spec(text: str) -> P:
    source = text if ("'" in text or '"' in text) else re.sub(r"\b(?!None\b)([A-Za-z_]\w*)\b", r"'\1'", text)
    try:
        entries = ast.literal_eval(f"({source},)") if source.strip() else ()
    except (ValueError, SyntaxError):
        raise MeshError(f"--spec requires entries like \"('dp','cp'),None\" or \"dp,None\", but got {text!r}") from None
    return P(*entries)


def _shape(text: str) -> tuple[int, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not all(re.fullmatch(r"-?\d+", t) for t in items):
        raise MeshError(f'--shape requires comma-separated ints like "8,6", but got {text!r}')
    return tuple(int(t) for t in items)


def _apply(mesh: Mesh, op: str, value: str) -> Mesh:
    if op == "select":
        names = _names(value, "--select")
        return mesh[names[0] if len(names) == 1 else names]
    if op == "flatten":
        axes, _, name = value.partition(":")
        return mesh.flatten(_names(axes, "--flatten"), name=name.strip() or None)
    if op == "unflatten":
        axis, sep, sizes = value.partition(":")
        if not sep:
            raise MeshError(f'--unflatten requires AXIS:a=2,b=4, but got {value!r}')
        return mesh.unflatten(axis.strip(), _sizes(sizes, "--unflatten"))
    if op == "transpose":
        return mesh.transpose(*_names(value, "--transpose"))
    if op == "take":
        axis, sep, index = value.partition("=")
        if not sep or not axis.strip():
            raise MeshError(f'--take requires AXIS=INDEX like "pp=0,3", "dp=1" or "tp=1:3", but got {value!r}')
        return mesh.take(**{axis.strip(): _index(index.strip(), value)})
    renames = {}
    for item in value.split(","):
        old, sep, new = item.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise MeshError(f'--rename requires OLD=NEW items like "dp=data", but got {item!r} in {value!r}')
        renames[old.strip()] = new.strip()
    return mesh.rename(renames)


def use_color(choice: str, isatty: bool, env: Mapping[str, str]) -> bool:
    """``--color``: "always", "never", or "auto" = on a terminal unless NO_COLOR is set (no-color.org)."""
    return choice == "always" or (choice == "auto" and isatty and not env.get("NO_COLOR"))


def show(args: argparse.Namespace) -> str:
    """The text ``show`` prints for parsed arguments (raises MeshError/TypeError on bad values)."""
    sizes = _sizes(args.mesh, "MESH")
    devices = _devices(args.devices) if args.devices is not None else None
    if args.order is not None:
        mesh = mesh_from_order(args.order, devices=devices, **sizes)
    else:
        mesh = make_mesh(tuple(sizes.values()), tuple(sizes), devices=devices)
    for op, value in getattr(args, "ops", None) or []:
        mesh = _apply(mesh, op, value)
    color = use_color(args.color, sys.stdout.isatty(), os.environ)
    parts = [visualize(mesh, args.axis, color=color, max_side=args.max_side)]
    if args.ranks_per_host is not None:
        span = mesh.host_span(args.ranks_per_host)
        width = max((len(n) for n in span), default=0)
        parts.append(f"host span ({args.ranks_per_host} ranks per host):\n"
                     + "\n".join(f"  {n.ljust(width)}  {where}" for n, where in span.items()))
    if (args.spec is None) != (args.shape is None):
        raise MeshError(f"--spec and --shape go together, but got spec={args.spec!r}, shape={args.shape!r}")
    if args.spec is not None:
        sharding = NamedSharding(mesh, _spec(args.spec))
        parts.append(visualize_sharding(sharding, _shape(args.shape), color=color, max_side=args.max_side))
    return "\n\n".join(parts)


def _plan_mesh(text: str, devices: str | None, what: str) -> Mesh:
    """``--src``/``--dst``: "dp=2,tp=2" with an optional "@START", or explicit ``--*-devices``."""
    body, at, start = text.partition("@")
    sizes = _sizes(body, what)
    if at and devices is not None:
        raise MeshError(f"{what} requires either @START or {what}-devices, but got both: {text!r} and {devices!r}")
    if at and not re.fullmatch(r"\s*\d+\s*", start):
        raise MeshError(f'{what} requires a non-negative int after @, like "tp=4@8", but got {text!r}')
    n = 1
    for size in sizes.values():
        n *= max(size, 0)
    ranks = _devices(devices) if devices is not None else range(int(start), int(start) + n) if at else None
    return make_mesh(tuple(sizes.values()), tuple(sizes), devices=ranks)


def plan_text(args: argparse.Namespace) -> str:
    """The text ``plan`` prints for parsed arguments (raises MeshError/TypeError on bad values)."""
    src = NamedSharding(_plan_mesh(args.src, args.src_devices, "--src"), _spec(args.src_spec))
    dst = NamedSharding(_plan_mesh(args.dst, args.dst_devices, "--dst"), _spec(args.dst_spec))
    plan = plan_reshard(src, dst, _shape(args.shape), args.dtype, relays=args.relays)
    return visualize(plan, color=use_color(args.color, sys.stdout.isatty(), os.environ), max_side=args.max_side)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: parse ``argv``, print the picture ``show`` draws.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        0 after printing; 141 (128 + SIGPIPE, what a shell reports for ``yes | head``) when the reader
        closed the pipe first, saying nothing more; a bad value exits with status 2 and a message
        naming it (argparse's way).

    Raises:
        SystemExit: on ``--help`` and on bad arguments (status 2).

    Examples:
        >>> main(["show", "tp=2"])
        Mesh(tp=2): 2 devices
          tp=0  tp=1
          0     1
        groups of each axis:
          tp  size 2, 1 group: [0 1]
        0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        text = plan_text(args) if args.command == "plan" else show(args)
    except (MeshError, TypeError) as exc:
        parser.exit(2, f"{parser.prog} {args.command}: error: {exc}\n")
    try:
        print(text)
        sys.stdout.flush()  # here, not at exit, where a closed pipe is a message we could not catch
    except BrokenPipeError:
        # The reader left (``| head``): stop quietly, as Unix tools do. Point stdout at /dev/null so
        # the interpreter's last flush of what is still buffered does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return 0


if __name__ == "__main__":
    sys.exit(main())
