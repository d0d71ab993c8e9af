"""How our torchrun test scripts end: without interpreter finalization.

On torch 2.13 CPU a process that had passed every step and called ``destroy_process_group``
sometimes aborted while Python finalized ("terminate called without an active exception": torch's
gloo threads at exit; 3 runs in 45 of tests/gpu/_funcol_probe.py, seen on CI too). That would fail
a run whose work was right, so the scripts flush and leave with ``os._exit`` (docs/gpu.md).
"""

from __future__ import annotations

import os
import sys


def exit_now(code: int = 0) -> None:
    """Flush stdout and stderr, then end the process with ``code``, skipping finalization."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
