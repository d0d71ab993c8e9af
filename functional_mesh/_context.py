"""A stack of values that eager code reads per thread or task, and compiled code can read too.

Two such stacks: the ``with rm:`` meshes and the open ``shard_map`` region (``_handle``); why a
module-level list beside the context variable: docs/design.md, "torch.compile".
"""

from __future__ import annotations

import contextvars
from typing import Generic, TypeVar

import torch

__all__ = ["ContextStack"]

T = TypeVar("T")


class ContextStack(Generic[T]):
    """Values pushed and popped in ``with`` blocks, read by eager and compiled code alike."""

    __slots__ = ("_var", "_list", "_shared")

    def __init__(self, name: str, *, shared: bool) -> None:
        self._var: contextvars.ContextVar[tuple[T, ...]] = contextvars.ContextVar(name, default=())
        self._list: list[T] = []  # what compiled code reads (and eager code between graphs, unshared)
        self._shared = shared

    def top(self, compiling: bool | None = None) -> T | None:
        """The innermost value, or ``None`` (``compiling``: ``torch.compiler.is_compiling()``, if known).

        Eagerly with nothing pushed (what every eager collective asks): one context-variable read
        and two attribute reads.
        """
        if not (torch.compiler.is_compiling() if compiling is None else compiling):
            stack = self._var.get()
            if stack:
                return stack[-1]
            if self._shared:
                return None
        entries = self._list
        return entries[-1] if entries else None

    def push(self, value: T) -> bool:
        """Make ``value`` the innermost; returns whether it was pushed while tracing (give it to :meth:`pop`)."""
        if torch.compiler.is_compiling():
            self._list.append(value)
            return True
        self._var.set(self._var.get() + (value,))
        if self._shared:
            self._list.append(value)
        return False

    def pop(self, value: T, traced: bool) -> None:
        """Undo the :meth:`push` of ``value`` (``traced``: what that push returned).

        Eagerly the context's innermost value goes (a ``with`` block leaves in order within its
        thread); on the list the last entry of ``value``, since threads may leave in any order.
        """
        if not traced:
            self._var.set(self._var.get()[:-1])
            if not self._shared:
                return
        entries = self._list
        if entries and entries[-1] is value:
            entries.pop()
            return
        for i in range(len(entries) - 1, -1, -1):
            if entries[i] is value:
                del entries[i]
                return
