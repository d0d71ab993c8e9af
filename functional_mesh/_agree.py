"""The bounded agreement behind realize's divergence check and the collectives' debug mode, and its wait.

Participants publish their requests in the default store; the first leads, compares and publishes
a verdict (docs/realize.md, "Divergent ranks"). :func:`as_check_timeout` is the one owner of the
wait. Talks to the store only; creates no process group.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from . import _torch
from ._errors import MeshError, requires

__all__ = ["CHECK_TIMEOUT_ENV", "DEFAULT_CHECK_TIMEOUT_S", "agree", "as_check_timeout", "next_call",
           "restart_numbering"]

CHECK_TIMEOUT_ENV = "FUNCTIONAL_MESH_CHECK_TIMEOUT"
DEFAULT_CHECK_TIMEOUT_S = 60.0

#
# One bounded agreement through the default store serves realize (participants: the whole world)
# and the opt-in collective check of _debug.py (participants: a group's members, or every
# device of a mesh). The first participant leads: it waits for every participant's request,
# compares, and publishes a verdict that the others wait for. Each call of a participant set has
# its own keys (a per-process call number, equal on every participant of an SPMD program), and
# every key is deleted once all participants have read it. A failed call's keys stay until the
# missing participant arrives: its late call meets the verdict and raises too.

_SLACK_S = 5.0  # a follower waits this much (at most half the wait) longer than the leader
_LAST_PREFIX = "functional_mesh/last"  # + /rank<r>: the last call rank r checked (one key per rank)
_CALLS: dict[str, int] = {}  # participant set -> agreements this process made in it (under _LOCK)
_LOCK = threading.Lock()


def as_check_timeout(check: bool | float, env: Mapping[str, str], api: str = "realize") -> float | None:
    """The agreement's wait in seconds: ``None`` when ``check`` is ``False``; ``check`` seconds, else
    ``$FUNCTIONAL_MESH_CHECK_TIMEOUT`` from ``env``, else 60 s. A pure function of its arguments.

    Raises:
        TypeError: ``check`` is neither a bool nor a number.
        MeshError: the seconds (given, or in ``env``) are not a positive, finite number.
    """
    if check is False:
        return None
    if check is True:
        raw = env.get(CHECK_TIMEOUT_ENV)
        if raw is None:
            return DEFAULT_CHECK_TIMEOUT_S
        try:
            value = float(raw)
        except ValueError:
            raise MeshError(requires(api, f"a number of seconds in ${CHECK_TIMEOUT_ENV}", CHECK_TIMEOUT_ENV,
                                     raw)) from None
    elif isinstance(check, (int, float)) and not isinstance(check, bool):
        value = float(check)
    else:
        raise TypeError(requires(api, "check=True, False or a number of seconds", "check", check))
    if not 0 < value < math.inf:  # also refuses NaN
        raise MeshError(requires(api, "a positive, finite check timeout", "check", value))
    return value


def restart_numbering() -> None:
    """Number every participant set's calls from 1 again (after ``fm.abort``: a re-formed job
    may hold new processes, which start at 1, beside the survivors)."""
    with _LOCK:
        _CALLS.clear()


def next_call(space: str) -> int:
    """The number of this process's next agreement among the participant set named ``space``."""
    with _LOCK:
        n = _CALLS[space] = _CALLS.get(space, 0) + 1
    return n


def agree(api: str, rule: str, label: str, prefix: str, participants: Sequence[int], rank: int, request: str,
           wait_s: float) -> None:
    """Raise ``MeshError`` on every participant that got there unless all asked for ``request``.

    Args:
        api, rule: the error reads "`<api>` requires <rule>, but <what went wrong>".
        label: how messages name this call, e.g. "realize call #7".
        prefix: store keys of this call; unique per participant set and call.
        participants: global ranks, the leader first; ``rank`` is one of them.
        request: what this rank asks for, as text (compared by digest, quoted in messages).
        wait_s: how long the leader waits for the others (followers wait a little longer).
    """
    store = _torch.default_store()
    digest = hashlib.sha1(request.encode(), usedforsecurity=False).hexdigest()[:16]
    mine = f"{prefix}/rank{rank}"
    store.set(mine, f"{digest} {request}")
    store.set(f"{_LAST_PREFIX}/rank{rank}", f"{label}, asking for {request}")
    verdict_key = f"{prefix}/verdict"
    leader = participants[0]
    if rank == leader:
        verdict = _lead(store, label, prefix, participants, request, wait_s)
    elif _wait_for(store, [verdict_key], wait_s + min(_SLACK_S, wait_s / 2)):
        absent = [r for r in participants if not store.check([f"{prefix}/rank{r}"])]
        # Give up, unless the leader decided in the meantime: the first decision stands for
        # everyone, so a late leader cannot pass a call the others already abandoned.
        verdict = _decide(store, verdict_key, f"{label} got no verdict from rank {leader} within {wait_s:g} s; "
                                              f"ranks not arrived: {absent}; rank {rank} asked for {request}"
                                              + _last_seen(store, absent))
    else:
        verdict = store.get(verdict_key).decode()
    _try_delete(store, mine)  # the leader has read every request once the verdict exists
    if store.add(f"{prefix}/read", 1) == len(participants):  # the last reader cleans up
        _try_delete(store, verdict_key)
        _try_delete(store, f"{prefix}/read")
    if verdict not in ("", "ok"):
        raise MeshError(f"`{api}` requires {rule}, but {verdict}")


def _lead(store: Any, label: str, prefix: str, participants: Sequence[int], request: str, wait_s: float) -> str:
    """The leader's verdict: wait for every request, compare, publish (the first verdict stands)."""
    verdict_key = f"{prefix}/verdict"
    if store.check([verdict_key]):  # a late leader: the others gave up on this call without it
        return store.get(verdict_key).decode()
    keys = [f"{prefix}/rank{r}" for r in participants]
    missing = [participants[i] for i in _wait_for(store, keys, wait_s)]
    if missing:
        verdict = (f"ranks {missing} did not reach {label} within {wait_s:g} s (the others asked for {request})"
                   + _last_seen(store, missing))
    else:
        verdict = _compare(label, {r: v.decode() for r, v in zip(participants, store.multi_get(keys), strict=True)})
    return _decide(store, verdict_key, verdict or "ok")


def _last_seen(store: Any, ranks: Sequence[int], limit: int = 4) -> str:
    """Where the first ``limit`` of ``ranks`` were last checked: what a missing rank does instead."""
    parts = []
    for r in ranks[:limit]:
        key = f"{_LAST_PREFIX}/rank{r}"
        seen = store.get(key).decode() if store.check([key]) else None
        parts.append(f"rank {r} was last at {seen}" if seen else f"rank {r} has made no checked call")
    return "".join(f"; {p}" for p in parts)


def _decide(store: Any, key: str, verdict: str) -> str:
    """Publish ``verdict`` unless one exists; return the verdict that stands (the first one)."""
    return store.compare_set(key, "", verdict).decode()


def _try_delete(store: Any, key: str) -> None:
    try:
        store.delete_key(key)
    except Exception:  # a store without deletion keeps the key: harmless
        pass


def _wait_for(store: Any, keys: list[str], wait_s: float) -> list[int]:
    """Wait for ``keys``; on timeout return the indices of the ones still missing."""
    try:
        store.wait(keys, datetime.timedelta(seconds=wait_s))
        return []
    except Exception:  # c10d raises DistStoreError (a RuntimeError) or its own timeout types
        return [i for i, k in enumerate(keys) if not store.check([k])]


def _compare(label: str, values: dict[int, str]) -> str:
    """"" when every rank sent the same request; else which ranks asked for what, largest set first."""
    by_request: dict[str, list[int]] = {}
    for r, v in values.items():
        by_request.setdefault(v, []).append(r)
    if len(by_request) == 1:
        return ""
    parts = "; ".join(f"ranks {ranks} asked for {v.split(' ', 1)[1]}" for v, ranks in
                      sorted(by_request.items(), key=lambda kv: (-len(kv[1]), kv[1])))
    return f"{label} differs across ranks: {parts}"
