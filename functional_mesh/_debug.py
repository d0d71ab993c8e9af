"""The collectives' opt-in debug check (``FUNCTIONAL_MESH_CHECK_COLLECTIVES``, off by default).

What it compares and the price: docs/realize.md, "Divergent ranks, and checking every collective".
:func:`debug_check` makes a call's :class:`Check` (or ``None``; off, one lookup: :func:`is_check_on`),
which the steps' autograd nodes call before each communication, forward and backward.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ._agree import agree, as_check_timeout, next_call
from ._errors import MeshError, requires

__all__ = ["CHECK_COLLECTIVES_ENV", "Check", "debug_check", "is_check_on"]

CHECK_COLLECTIVES_ENV = "FUNCTIONAL_MESH_CHECK_COLLECTIVES"
_CHECK_MODES = {"1": "group", "group": "group", "mesh": "mesh"}  # setting -> participants

# The setting is read at every call, from os.environ's own mapping where it has one (CPython:
# bytes keys on POSIX): a dict lookup, where os.environ.get encodes the key first (~1 us).
_ENVIRON = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(CHECK_COLLECTIVES_ENV) if _ENVIRON is not None else None
_OFF = (b"", b"0") if _ENVIRON is not None else ("", "0")  # the settings that mean off, as the environment holds them


def is_check_on() -> bool:
    """Whether the debug check is on (set, and neither empty nor ``0``): one lookup, every call's cost."""
    raw = _ENVIRON.get(_ENV_KEY) if _ENVIRON is not None else os.environ.get(CHECK_COLLECTIVES_ENV)
    return raw is not None and raw not in _OFF


def _setting() -> str | None:
    if _ENVIRON is None:
        return os.environ.get(CHECK_COLLECTIVES_ENV)
    raw = _ENVIRON.get(_ENV_KEY)
    return None if raw is None else os.environ.decodevalue(raw)


class Check:
    """Agreement before each communication of one public collective call (debug mode only).

    Built per call when the mode is on; the autograd functions keep it for their backward.
    """

    def __init__(self, api: str, rm: Any, names: tuple[str, ...], params: str, mode: str, setting: str) -> None:
        self.api, self.rm, self.names, self.params, self.mode, self.setting = api, rm, names, params, mode, setting
        wait_s = as_check_timeout(True, os.environ, api)
        assert wait_s is not None  # check=True always has a wait
        self.wait_s = wait_s

    def __call__(self, x: torch.Tensor, axes: tuple[str, ...], *, members: Sequence[int] | None = None,
                 group: Any = None, backward: bool = False) -> None:
        """Agree on the step over ``axes`` (``members``, or the members of ``group``) that sends ``x``."""
        rm = self.rm
        if self.mode == "mesh":
            devices = rm.mesh.device_list
            participants = devices.to_array().tolist()
            space, where = f"mesh/{devices.digest()}", f"mesh devices {devices.describe()}"
            rule = "every device of the mesh to make the same sequence of collective calls"
        else:
            participants = list(members) if members is not None else dist.get_process_group_ranks(group)
            text = ",".join(map(str, participants))
            space = "group/" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]
            where = f"group {participants}" if len(participants) <= 16 else f"a group of {len(participants)} ranks"
            rule = "every member of the group to make the same collective call"
        if len(participants) < 2:  # nobody to disagree with
            return
        n = next_call(space)
        over = "" if axes == self.names else f", step over {axes!r}"
        step = f"backward of {self.api}" if backward else self.api
        request = (f"{step}(axis={self.names!r}{self.params}{over}) on {rm.mesh!r} with "
                   f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}")
        agree(self.api, f"{rule} ({CHECK_COLLECTIVES_ENV}={self.setting})", f"collective call #{n} of {where}",
              f"functional_mesh/collective/{space}/{n}", participants, rm.rank, request, self.wait_s)


def debug_check(api: str, rm: Any, names: tuple[str, ...], traced: bool, params: Callable[[], str]) -> Check | None:
    """The debug check of one call, or ``None`` when the mode is off (one environment lookup).

    ``params``: the call's parameters as the check compares them (made only when the mode is on).
    """
    setting = _setting()
    if not setting or setting == "0":
        return None
    if setting not in _CHECK_MODES:
        raise MeshError(requires(api, f"${CHECK_COLLECTIVES_ENV} to be a known mode", CHECK_COLLECTIVES_ENV, setting,
                                 "'0' (off), '1' or 'group' (each group's members agree), 'mesh' (the whole "
                                 "mesh agrees)"), mesh=rm.mesh)
    if rm.backend == "fake":  # fake collectives carry no data: nothing to compare
        return None
    if traced:  # the agreement talks to the store: it cannot be part of a graph
        raise MeshError(requires(api, f"${CHECK_COLLECTIVES_ENV} off under torch.compile (the collective check runs "
                                 "in eager mode only)", CHECK_COLLECTIVES_ENV, setting, "'0' or unset")
                        + "; run the program eagerly to check it, then compile it with the check off", mesh=rm.mesh)
    return Check(api, rm, names, params(), _CHECK_MODES[setting], setting)
