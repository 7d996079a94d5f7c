"""Child processes that do not outlive their parent: a SIGKILLed `launch run` (no handler can run) must not leave
torchrun and the ranks training, holding the master port and the run folder."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Asks Linux to send `signum` to this process when its parent dies (prctl PR_SET_PDEATHSIG); False where
    that is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def dies_with_this_process(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen: the child gets `signum` when this process dies, even by SIGKILL. A
    parent that died before the child could ask is caught by comparing the parent id."""
    parent = os.getpid()

    def preexec() -> None:
        if parent_death_signal(signum) and os.getppid() != parent:
            os.kill(os.getpid(), signum)

    return preexec
