"""The library's one exception family and the helpers that phrase its messages.

Every message follows one template so users learn to read it once::

    `<api>` requires <rule>, but got <name>=<value!r>; valid: <choices>

and an unknown axis name adds "did you mean 'tp'?" when a close name exists.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["MeshError", "UnknownAxisError"]


class MeshError(ValueError):
    """A bad value given to functional_mesh: the message names it and the valid choices.

    Attributes:
        mesh: the mesh the failing call was about, when there is one (else ``None``).
    """

    __module__ = "functional_mesh"  # tracebacks name the public home: functional_mesh.MeshError

    def __init__(self, message: str, *, mesh: Any = None) -> None:
        # BaseException.__new__ has already stored ``message`` in ``args``; not calling
        # super().__init__ keeps the constructor traceable by torch.compile, so a MeshError raised
        # at trace time reaches the user (inside torch's error, with fullgraph=True) with its text.
        self.mesh = mesh


class UnknownAxisError(MeshError, KeyError):
    """An axis name that the mesh does not have. Also a ``KeyError``, like a missing dict key."""

    __module__ = "functional_mesh"

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and print it in quotes.
        return str(self.args[0])


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """Return " did you mean 'x'?" for the closest of ``choices``, or "" when none is close."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    # A swap of two letters ("pd" for "dp") ties with a one-letter change ("tp"): prefer the anagram.
    close.sort(key=lambda c: sorted(c) != sorted(name))
    return f"; did you mean {close[0]!r}?" if close else ""


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
