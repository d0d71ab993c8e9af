"""The fuzz harness: one ``Case`` per drawn call, one rule for every public entry point.

An entry point is a hypothesis strategy of :class:`Case` registered on a :class:`Registry`;
``registry.test()`` turns the registry into one parametrized test (one id per entry point).
Every case is a single call with at most one thing wrong:

* a *valid* case must return (an optional ``check`` then inspects the result), so the suite
  also catches over-eager rejection;
* a *bad* case must raise ``MeshError`` or ``TypeError`` (nothing else, and not succeed),
  and the message must name the bad value: a recognisable ``repr``/``str`` of one of
  ``case.bad`` appears after "but got" (or anywhere, when the message has no "but got").

Adding an entry point is one ``@registry.entry("name")`` function that draws a case.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import functional_mesh as fm

__all__ = [
    "BAD_INTS",
    "BAD_NAMES",
    "FIXED_BUGS",
    "OPEN_BUGS",
    "Case",
    "Registry",
    "Shown",
    "bad",
    "bad_axis_name",
    "check_still_open",
    "fresh_name",
    "fresh_names",
    "is_open",
    "mentions",
    "misspell",
    "pick",
    "run",
    "valid",
]

ALLOWED = (fm.MeshError, TypeError)

# Calls made in this process, by verdict ("valid", "bad"): tests/conftest.py prints the totals.
COUNTS: dict[str, int] = {"valid": 0, "bad": 0}


@dataclass(frozen=True)
class Shown:
    """A culprit given as the exact text the message shows (e.g. a layout tuple printed with ``str``)."""

    text: str


@dataclass(frozen=True)
class Case:
    """One call of one entry point. ``bad`` empty: valid input; else the values it may name (any one)."""

    what: str
    call: Callable[[], Any] = field(repr=False)
    bad: tuple[object, ...] = ()
    check: Callable[[Any], None] | None = field(default=None, repr=False)
    unknown_axis: str | None = None  # the misspelt/unknown axis name: the error must be an UnknownAxisError
    suggest: bool = False  # ... and say "did you mean"


def valid(what: str, call: Callable[[], Any], check: Callable[[Any], None] | None = None) -> Case:
    return Case(what, call, (), check)


def bad(what: str, call: Callable[[], Any], *culprits: object, unknown_axis: str | None = None,
        suggest: bool = False) -> Case:
    assert culprits, "a bad case names at least one culprit"
    return Case(what, call, culprits, None, unknown_axis, suggest)


# -- the rule ------------------------------------------------------------------------------------


class FuzzFailure(AssertionError):
    """The library broke the rule on a case (the message says which case and how)."""


def run(case: Case, count: bool = True) -> None:
    """Call ``case`` and enforce the rule; raises :class:`FuzzFailure` on a violation."""
    if count:
        COUNTS["bad" if case.bad else "valid"] += 1
    try:
        out = case.call()
    except ALLOWED as e:
        text = str(e)
        if not case.bad:
            raise FuzzFailure(f"valid input rejected ({case.what}): {type(e).__name__}: {text}") from e
        if not any(mentions(text, v) for v in case.bad):
            raise FuzzFailure(
                f"message does not name the bad value ({case.what}); expected one of "
                f"{sorted(set().union(*(forms(v) for v in case.bad)))} in: {text!r}") from e
        if case.unknown_axis is not None:
            if not isinstance(e, fm.UnknownAxisError):
                raise FuzzFailure(f"unknown axis {case.unknown_axis!r} gave {type(e).__name__}, not "
                                  f"UnknownAxisError ({case.what}): {text}") from e
            if case.suggest and "did you mean" not in text:
                raise FuzzFailure(f"no 'did you mean' for the misspelt axis {case.unknown_axis!r} "
                                  f"({case.what}): {text}") from e
        return
    except Exception as e:  # any other type is the bug this suite looks for
        raise FuzzFailure(f"{type(e).__name__} escaped ({case.what}; "
                          f"{'bad: ' + repr(case.bad) if case.bad else 'valid input'}): {e}") from e
    if case.bad:
        raise FuzzFailure(f"bad input accepted silently ({case.what}; bad: {case.bad!r}); returned {out!r}"[:2000])
    if case.check is not None:
        case.check(out)


def forms(value: object) -> set[str]:
    """Texts under which a message may show ``value``."""
    if isinstance(value, Shown):
        return {value.text}
    out = {repr(value)}
    if isinstance(value, (list, tuple)):
        out |= {repr(tuple(value)), repr(list(value))}
    elif isinstance(value, (bool, np.bool_)):
        out.add(str(bool(value)))
    elif isinstance(value, (int, np.integer)):
        out |= {repr(int(value)), repr(float(value)) if abs(int(value)) < 2**53 else repr(int(value))}
    elif isinstance(value, (float, np.floating)):
        out.add(repr(float(value)))
    elif not isinstance(value, str):
        out.add(str(value))
    return out


def mentions(text: str, value: object) -> bool:
    """True when ``text`` names ``value``: a form of it, after "but got" when there is one.

    Short forms (``0``, ``3``) must stand alone, not inside another number or name.
    """
    region = text.split("but got", 1)[1] if "but got" in text else text
    for form in forms(value):
        if len(form) >= 3:
            if form in region:
                return True
        elif re.search(r"(?<![\w.'\"])" + re.escape(form) + r"(?![\w'\"]|\.[\d.])", region):
            return True
    return False


# -- registry ------------------------------------------------------------------------------------


class Registry:
    """Entry points of one test module: ``@REG.entry("name")`` on a function ``(draw) -> Case``."""

    def __init__(self) -> None:
        self.entries: dict[str, Callable[..., st.SearchStrategy[Case]]] = {}

    def entry(self, name: str) -> Callable:
        def register(fn: Callable) -> Callable:
            assert name not in self.entries, name
            self.entries[name] = st.composite(fn)
            return fn
        return register

    def test(self, around: Callable[[Case], None] = run) -> Callable:
        """The parametrized test: every entry point, each over the active hypothesis profile."""
        names = sorted(self.entries)

        @pytest.mark.parametrize("entry", names)
        @given(data=st.data())
        def test_entry_point(entry: str, data: st.DataObject) -> None:
            case = data.draw(self.entries[entry](), label="case")
            event("bad input" if case.bad else "valid input")  # shown by --hypothesis-show-statistics
            around(case)

        return test_entry_point


# -- value pools -------------------------------------------------------------------------------

_OBJ = object()

# Not an int, wherever an int (a size, a rank, a dim, a device) is expected.
BAD_INTS: tuple[object, ...] = (
    2.0, 2.5, -1.5, float("nan"), float("inf"), True, False, None, "2", b"2", [2], (2,), {"n": 2}, {2},
    2 + 0j, np.float64(2.0), np.bool_(True), _OBJ,
)
# Not a str, wherever one axis name is expected.
BAD_NAMES: tuple[object, ...] = (3, 0, 2.5, None, True, b"dp", {"dp": 1}, {"dp"}, _OBJ, np.int64(1))


def int_like(draw: Callable, value: int) -> object:
    """``value`` as an int, a numpy integer or a 0-d integer array (all valid ints)."""
    kind = draw(st.sampled_from(["int", "int", "np", "0d"]))
    if kind == "np":
        return np.int64(value)
    if kind == "0d":
        return np.array(value)
    return value


def misspell(name: str, taken: tuple[str, ...]) -> str:
    """A name close to ``name`` (its last letter doubled, then more) that is not in ``taken``."""
    out = name + name[-1]
    while out in taken:
        out += name[-1]
    return out


def fresh_names(taken: tuple[str, ...] | set[str], prefix: str = "n", k: int = 1) -> list[str]:
    """``k`` distinct names ``<prefix><i>`` (smallest ``i`` first) not in ``taken``: deterministic,
    so hypothesis replays a failing example exactly."""
    out: list[str] = []
    i = 0
    while len(out) < k:
        name = f"{prefix}{i}"
        if name not in taken:
            out.append(name)
        i += 1
    return out


def fresh_name(taken: tuple[str, ...] | set[str], prefix: str = "n") -> str:
    return fresh_names(taken, prefix)[0]


def pick(draw, seq):
    """One element of ``seq``, drawn by hypothesis (so it shrinks)."""
    return draw(st.sampled_from(list(seq)))


def bad_axis_name(draw, names: tuple[str, ...], extra_types: tuple[object, ...] = ()) -> tuple[str, object, dict]:
    """``(label, value, bad-kwargs)`` for one axis-name slot that must be refused."""
    kind = pick(draw, ["misspelt", "misspelt", "unknown", "type", "empty"])
    if kind == "misspelt":
        v = misspell(pick(draw, names), names)
        return f"misspelt axis {v!r}", v, {"unknown_axis": v, "suggest": True}
    if kind == "unknown":
        v = fresh_name(names, "zz")
        return f"unknown axis {v!r}", v, {"unknown_axis": v}
    if kind == "empty":
        return "empty axis name", "", {}
    v = pick(draw, BAD_NAMES + extra_types)
    return f"non-str axis {v!r}", v, {}


# -- library bugs: fixed (regressions) and open -----------------------------------------------
#
# FIXED_BUGS: every bug this suite found, as its minimal reproduction; each now obeys the rule
# (tests/fuzz/test_bugs.py runs them all, every time). OPEN_BUGS: a bug found but not fixed yet
# (key -> reproduction). The generators skip a mutation while its key is open (is_open), so a run
# stays useful, and test_bugs.py checks each open reproduction still breaks the rule
# (check_still_open): once it is fixed that test fails, telling you to move the entry to FIXED_BUGS.

_M = fm.make_mesh((2, 4), ("dp", "tp"))

def _expect(ok: bool, out: object) -> None:
    if not ok:
        raise AssertionError(f"unexpected result {out!r}")


FIXED_BUGS: dict[str, Case] = {
    "make_mesh-unordered-sizes": bad(
        "make_mesh(axis_sizes={2, 3}) (a set) is accepted; a dict of int keys too",
        lambda: fm.make_mesh({4: "x"}, ("a",)), {4: "x"}),
    "Mesh-layouts-not-iterable": bad(
        "Mesh(names, layouts=5) raises TypeError \"'int' object is not iterable\", not naming 5",
        lambda: fm.Mesh(("a",), 5, 2), 5),
    "flatten-name-sequence": bad(
        "Mesh.flatten(name=('x',)) is accepted as name 'x'",
        lambda: _M.flatten(("dp", "tp"), name=("x",)), ("x",)),
    "unflatten-axis-tuple": bad(
        "Mesh.unflatten(('tp', 'dp'), ...) silently unflattens 'tp' and ignores 'dp'",
        lambda: _M.unflatten(("tp", "dp"), {"x": 2, "y": 2}), ("tp", "dp")),
    "shape-unhashable-key": bad(
        "mesh.shape[['dp']] (an unhashable key) raises TypeError 'unhashable type: list', not naming it",
        lambda: _M.shape[["dp"]], ["dp"]),
    "visualize-huge": valid(
        "visualize of a family over 2**62 symbolic devices raises numpy's ValueError 'array is too big' "
        "(it materialises mesh.groups(); at 2**30 devices it would allocate gigabytes)",
        lambda: fm.visualize(fm.make_mesh((2**30, 2**30, 4), ("a", "b", "c"))["c"])),
    "host_span-huge": valid(
        "Mesh.host_span(10**30) raised OverflowError (one host then holds every device)",
        lambda: _M.host_span(10**30), lambda out: _expect(out == {"dp": "intra-host", "tp": "intra-host"}, out)),
}


def _realize_bug(kwargs: dict[str, object]) -> Callable[[], Any]:
    def call() -> Any:
        from tests.fuzz._world import fake_world

        with fake_world(0, 8):
            return fm.realize(_M, **kwargs)
    return call


def _gloo_bug(kwargs: dict[str, object]) -> Callable[[], Any]:
    def call() -> Any:
        import torch.distributed as dist

        if dist.is_initialized():
            fm.clear_cache()
            dist.destroy_process_group()
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        try:
            return fm.realize(fm.make_mesh((1,), ("w",)), check=False, **kwargs)
        finally:
            fm.clear_cache()
            dist.destroy_process_group()
    return call


def _collective_bug(fn: str, *args: object, **kwargs: object) -> Callable[[], Any]:
    def call() -> Any:
        import torch

        from tests.fuzz._world import fake_world

        with fake_world(0, 8):
            rm = fm.realize(_M)
            stand_in = {"0-d": torch.ones(()), "vector": torch.ones(2)}
            real = [stand_in.get(a, a) if isinstance(a, str) and a in stand_in else a for a in args]
            return getattr(fm, fn)(*real, mesh=rm, **kwargs)
    return call


FIXED_BUGS.update({
    "realize-timeout-overflow": bad(
        "realize(timeout=float('inf')) / timeout=1e20 raises OverflowError",
        _realize_bug({"timeout": float("inf")}), float("inf")),
    "realize-timeout-timedelta": bad(
        "realize(timeout=timedelta(seconds=-5)) (or timedelta(0)) is accepted",
        _realize_bug({"timeout": datetime.timedelta(seconds=-5)}),
        datetime.timedelta(seconds=-5)),
    "realize-backend-unchecked": bad(
        "on a gloo default group, realize(backend=5) raises AttributeError, backend='bogus' an AssertionError "
        "from c10d, and device_type='cuda' on a CPU-only torch a RuntimeError from new_group",
        _gloo_bug({"backend": 5}), 5),
    "realize-check-nan": bad(
        "realize(check=float('nan')) is accepted",
        _realize_bug({"check": float("nan")}), float("nan")),
    "realize-device-type-unhashable": bad(
        "realize(device_type=['cpu']) raises TypeError 'unhashable type: list', not naming the value",
        _realize_bug({"device_type": ["cpu"]}), ["cpu"]),
    "realize-product-twice": valid(
        "realize(products=[('w',), ('w',)]) raised KeyError: the result's groups were put in mesh order by "
        "popping each family's key, and a product given twice popped it twice",
        _gloo_bug({"products": [("w",), ("w",)]})),
    "collective-0d-tensor": bad(
        "all_gather / psum_scatter / all_to_all of a 0-d tensor (tiled) raise IndexError",
        _collective_bug("all_gather", "0-d", "tp"), 0, Shown("0-d")),
    "ppermute-perm-not-iterable": bad(
        "ppermute(x, 'tp', 5) raises TypeError \"'int' object is not iterable\", not naming 5",
        _collective_bug("ppermute", "vector", "tp", 5), 5),
    "collective-tiled-not-bool": bad(
        "all_gather(..., tiled='no') is accepted (a truthy str); tiled=None silently means untiled",
        _collective_bug("all_gather", "vector", "tp", tiled="no"), "no"),
})


def _distribute_outside_bug() -> Any:
    import torch

    from tests.fuzz._world import fake_world

    with fake_world(8, 9):  # rank 8 of 9: outside the (2, 4) mesh
        rm = fm.realize(_M)
        return fm.distribute(torch.zeros(()), fm.NamedSharding(_M, fm.P("dp")), mesh=rm)


FIXED_BUGS.update({
    "distribute-outside-unchecked": bad(
        "on a rank outside the mesh, distribute of a 0-d tensor for P('dp') returns None: the spec's rank "
        "was checked only on the mesh's ranks", _distribute_outside_bug, ()),
})


OPEN_BUGS: dict[str, Case] = {}


def is_open(key: str) -> bool:
    """True while the bug ``key`` is open: the generators then leave that mutation out.

    A key in neither dict is a ``KeyError``: a misspelt key would silently keep its mutation out
    (or in) whatever the bug's state.
    """
    if key not in OPEN_BUGS and key not in FIXED_BUGS:
        raise KeyError(f"no bug {key!r} in FIXED_BUGS or OPEN_BUGS")
    return key in OPEN_BUGS


def check_still_open(key: str, case: Case) -> None:
    """Raise ``AssertionError`` when the open bug ``key`` no longer breaks the rule (it was fixed)."""
    try:
        run(case, count=False)
    except FuzzFailure:
        return
    raise AssertionError(f"open bug {key!r} no longer reproduces: move it to FIXED_BUGS ({case.what})")
