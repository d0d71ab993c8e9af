"""The library's one exception family and the helpers that phrase its messages.

One template for every message: docs/design.md, "Errors".
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

__all__ = ["MeshError", "UnknownAxisError"]


class MeshError(ValueError):
    """A bad value given to functional_mesh: the message names it, the call, and the valid choices.

    A ``ValueError``; wrong types are a ``TypeError`` (docs/design.md, "Errors").

    Args:
        message: the text.
        mesh: the mesh the failing call was about, when there is one; kept as ``e.mesh`` (else ``None``).

    Examples:
        >>> try:
        ...     fm.make_mesh((2, 0), ("dp", "tp"))
        ... except fm.MeshError as e:
        ...     print(e)
        `make_mesh` requires positive axis sizes, but got axis_sizes['tp']=0
    """

    __module__ = "functional_mesh"  # tracebacks name the public home: functional_mesh.MeshError

    def __init__(self, message: str, *, mesh: Any = None) -> None:
        # BaseException.__new__ has already stored ``message`` in ``args``; not calling
        # super().__init__ keeps the constructor traceable by torch.compile, so a MeshError raised
        # at trace time reaches the user (inside torch's error, with fullgraph=True) with its text.
        self.mesh = mesh


class UnknownAxisError(MeshError, KeyError):
    """An axis name that the mesh does not have. Also a ``KeyError``, like a missing dict key.

    The message lists the mesh's axes and, for a plausible typo of one, asks "did you mean" it.

    Args:
        message: the text.
        mesh: the mesh that lacks the axis, when there is one.

    Examples:
        >>> mesh = fm.make_mesh((2, 4), ("dp", "tp"))
        >>> try:
        ...     mesh["pt"]
        ... except KeyError as e:
        ...     print(e)
        `Mesh[...]` requires an axis name of the mesh, but got axis='pt'; valid: ('dp', 'tp'); did you mean 'tp'?
    """

    __module__ = "functional_mesh"

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and print it in quotes.
        return str(self.args[0])


# The errors name their public home as their module (tracebacks say functional_mesh.MeshError), so
# doctest's finder would pass their docstrings over: listed here, their examples run too.
__test__ = MappingProxyType({"MeshError": MeshError, "UnknownAxisError": UnknownAxisError})


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" when ``name`` is a plausible typo of exactly one of ``choices``, else "".

    The rule (case, a swap, one letter more or less, a substitution in a long part only):
    docs/design.md, "Errors".
    """
    if not isinstance(name, str) or not name:
        return ""
    best: tuple[int, list[str]] = (_NO_TYPO, [])
    for choice in dict.fromkeys(choices):  # distinct, in order
        kind = _typo_kind(name, choice)
        if kind < best[0]:
            best = (kind, [choice])
        elif kind == best[0]:
            best[1].append(choice)
    kind, found = best
    return f"; did you mean {found[0]!r}?" if kind < _NO_TYPO and len(found) == 1 else ""


_LONG_PART = 5  # letters in a part of a name (between underscores) from which a substitution is plausible
_NO_TYPO = 5  # the kind of a choice that ``name`` is no plausible typo of


def _typo_kind(name: str, choice: str) -> int:
    """1-4: the kind of typo (see :func:`did_you_mean`) that turns ``choice`` into ``name``; ``_NO_TYPO``:
    none (or no typo at all: the same name)."""
    if name == choice:
        return _NO_TYPO
    typed, want = name.casefold(), choice.casefold()
    if typed == want:
        return 1
    if len(typed) == len(want):
        diff = [i for i, (a, b) in enumerate(zip(typed, want)) if a != b]
        if len(diff) == 2 and diff[1] == diff[0] + 1 and typed[diff[0]] == want[diff[1]] \
                and typed[diff[1]] == want[diff[0]]:
            return 2
        if len(diff) == 1:
            start = want.rfind("_", 0, diff[0]) + 1
            end = want.find("_", diff[0])
            part = want[start:] if end < 0 else want[start:end]
            return 4 if len(part) >= _LONG_PART else _NO_TYPO
        return _NO_TYPO
    shorter, longer = sorted((typed, want), key=len)
    if len(longer) - len(shorter) == 1:
        i = next((i for i, (a, b) in enumerate(zip(shorter, longer)) if a != b), len(shorter))
        if longer[:i] + longer[i + 1:] == shorter:
            return 3
    return _NO_TYPO


def requires(api: str, rule: str, name: str, value: object, valid: object = None) -> str:
    """Format the house message: what ``api`` requires, the bad value, the valid choices."""
    msg = f"`{api}` requires {rule}, but got {name}={value!r}"
    if valid is not None:
        msg += f"; valid: {valid}"
    return msg


def unknown_axis(api: str, name: object, axis_names: tuple[str, ...], mesh: Any = None) -> UnknownAxisError:
    """The error for an axis name that is not one of ``axis_names``."""
    msg = requires(api, "an axis name of the mesh", "axis", name, axis_names)
    return UnknownAxisError(msg + did_you_mean(name, axis_names), mesh=mesh)
