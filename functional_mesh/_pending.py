"""Collectives issued now and waited for later (``async_op=True``): the pending result and how it is made.

A :class:`Slot` on the call lets the collective's own function start its first communication
(issue), then run again on the arrived buffer (wait): docs/design.md, "Issue now, wait later".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import _steps as S
from . import _torch
from ._errors import MeshError, requires

__all__ = ["Pending", "Slot"]

_ISSUE, _STARTED, _REPLAY, _DONE = range(4)  # a slot's states, in order


class _Started(Exception):  # noqa: N818 - a signal, not an error: a pending result catches it, users never see it
    """Stops a collective's function once its first communication has started (issue mode)."""


class Slot:
    """Where one call issued with ``async_op=True`` keeps its started communication, between issue and wait.

    Each step that communicates passes through :meth:`take`; a blocking exchange made before the
    first one (``ragged_all_to_all``'s counts) through :meth:`once`.
    """

    __slots__ = ("state", "arrived", "work", "kept")

    def __init__(self) -> None:
        self.state = _ISSUE
        self.arrived: Any = None  # the started communication's buffer
        self.work: Any = None  # its c10d Work (None under torch.compile: wait_tensor waits)
        self.kept: Any = None

    def take(self, x: torch.Tensor, step: S.AsyncStep, check: Callable[..., None] | None) -> S.Step:
        """The step to run in place of ``step`` (one that communicates, on ``x``).

        Issuing, the first one: the debug ``check`` (when on), then ``step`` started on ``x`` (whose
        gradient the wait-time replay takes), and the function stops here. Replaying, the first
        one: the started step, arrived. Every later one: ``step`` itself (blocking).
        """
        if self.state == _ISSUE:
            if check is not None:
                check(x, backward=False)
            self.arrived, self.work = step.start(x.detach())
            self.state = _STARTED
            raise _Started
        if self.state == _REPLAY:
            self.state = _DONE
            return S.Arrived(step, self.arrived)
        return step

    def once(self, make: Callable[[], Any]) -> Any:
        """``make()`` when issuing; the same value again when replaying (no second exchange)."""
        if self.state == _ISSUE:
            self.kept = make()
        return self.kept

    def arrive(self) -> None:
        """Wait for the started communication; the next run of the function replays."""
        if self.state == _STARTED:
            self.arrived = _torch.wait(self.arrived, self.work)
            self.work = None
            self.state = _REPLAY

    def is_completed(self, api: str) -> bool:
        if self.state != _STARTED:
            return True
        if self.work is None:
            _torch.raise_while_tracing(False, requires(
                api, "eager mode for is_completed() (under torch.compile the graph holds the communication and its "
                "wait, and no Python object sees it run)", "torch.compiler.is_compiling()", True)
                + "; call wait() instead")
        return bool(self.work.is_completed())


class Pending:
    """A collective issued with ``async_op=True``: started, not yet waited for.

    ``wait()`` gives exactly the tensor the blocking call gives (values, gradients, type); what
    overlaps and what compiles: docs/collectives.md, "Issue now, wait later".

    Attributes:
        api: the collective's name (``"psum"``, ...).
        axis: the axes it communicates over (a tuple of names).

    Examples:
        >>> pending = fm.psum(torch.ones(2, 3), "tp", mesh=rm, async_op=True)
        >>> pending.wait().shape, pending.wait() is pending.wait()
        (torch.Size([2, 3]), True)
    """

    __slots__ = ("api", "axis", "_fn", "_call", "_slot", "_dtype", "_out", "_waited", "_then")

    def __init__(self, fn: Callable[[Any], torch.Tensor], call: Any, dtype: torch.dtype | None) -> None:
        """Issue ``call`` (bound, with a fresh :class:`Slot`) of the collective function ``fn``; ``dtype``: the
        dtype to cast the result back to (``op_dtype``), or ``None``."""
        self.api, self.axis = call.api, call.names
        self._fn, self._call, self._slot, self._dtype = fn, call, call.slot, dtype
        self._waited = False
        self._then: tuple[Callable[..., None], tuple[Any, ...]] | None = None
        try:
            out = fn(call)
        except _Started:
            out = None
        else:  # nothing to communicate (size-1 axes, pvary): complete already
            if dtype is not None:
                out = out.to(dtype)
        self._out = out

    @property
    def waited(self) -> bool:
        """Whether :meth:`wait` was called."""
        return self._waited

    def when_waited(self, record: Callable[..., None], *args: Any) -> None:
        """Call ``record(tensor, *args)`` when the result is waited for (a typed region: its type)."""
        self._then = (record, args)

    def is_completed(self) -> bool:
        """Whether the communication has completed (eager mode: c10d's ``Work.is_completed()``); never waits.

        Returns:
            ``True`` once it has (or once :meth:`wait` returned), ``False`` while a member has
            not yet issued it.

        Raises:
            MeshError: asked under ``torch.compile``, where no Python object sees the
                communication run.
        """
        return self._waited or self._slot.is_completed(self.api)

    def wait(self) -> torch.Tensor:
        """The collective's result: exactly the tensor the blocking call returns.

        Waits for the communication started at issue, then does the rest of the call (a tuple's
        later axes, blocking; the local work after). A second call returns the same tensor.

        Returns:
            The result, with its gradient and, in a typed region, its type.
        """
        if not self._waited:
            out = self._out
            if out is None:
                with _torch.no_torch_function():  # as inside the call: no region sees the collective's own ops
                    self._slot.arrive()
                    out = self._fn(self._call)
                    if self._dtype is not None:
                        out = out.to(self._dtype)
                self._out = out
            self._waited = True
            if self._then is not None:
                record, args = self._then
                record(out, *args)
        return self._out

    def __repr__(self) -> str:
        axis = self.axis[0] if len(self.axis) == 1 else self.axis
        return f"Pending({self.api} over {axis!r}, {'waited for' if self._waited else 'not waited for'})"
