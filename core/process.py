"""Child processes that do not outlive their parent, and a parent that stops them the way a preempted run stops.

A SIGKILLed `launch run`, `pretrain ladder` or `pretrain mixture` (no handler can run) must not leave torchrun and
the ranks training, holding the master port and the run folder (`dies_with_this_process`). A signalled one passes
the signal to the ranks and waits for their checkpoint (`supervise`): it does not return while they still write.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from core.exit_codes import PREEMPTED
from core.layout import CHECKPOINT_TAG, COMPLETE
from core.log import get_logger

log = get_logger(__name__)

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


def children(pid: int) -> list[int]:
    """Direct children of a process (Linux /proc); empty where that is not available."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        return []
    return out


def complete_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> dict[str, float]:
    """{tag: mtime of its COMPLETE marker} of the complete checkpoints in a folder (empty if none / no folder)."""
    out: dict[str, float] = {}
    try:
        tags = [e.name for e in os.scandir(checkpoint_dir) if CHECKPOINT_TAG.match(e.name)]
    except OSError:
        return out
    for tag in tags:
        try:
            out[tag] = os.stat(os.path.join(checkpoint_dir, tag, COMPLETE)).st_mtime
        except OSError:
            continue
    return out


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def supervise(
    procs: list[subprocess.Popen],
    rank_depth: int = 1,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    name: str = "[launch]",
) -> int:
    """Waits for launched training processes, forwarding a preemption signal to their ranks; returns the exit
    code. 'Signalled and not clean' is 75 ("checkpointed, requeue me") only when a checkpoint was written after
    the signal (checked in `checkpoint_dir` when given): a Ctrl-C that ended the ranks before they saved is the
    ranks' own failure code, not a requeue. The signal handlers are this call's alone: the caller's come back
    when it returns (a ladder between rungs is stopped by Ctrl-C as before)."""
    signalled: list[int] = []
    before: dict[str, float] = {}  # complete checkpoints at the first signal

    def forward(signum, _frame):
        if not signalled and checkpoint_dir is not None:
            before.update(complete_checkpoints(checkpoint_dir))
        signalled.append(signum)
        for p in procs:
            if p.poll() is None:
                # Signal the ranks themselves (torchrun's children), not torchrun: torchrun would answer TERM by
                # signalling each rank's whole process group, DataLoader workers included, and the ranks would
                # die mid-step instead of checkpointing. The trainer treats TERM and USR1 alike.
                ranks = [p.pid]
                for _ in range(rank_depth):
                    ranks = [c for r in ranks for c in children(r)]
                for pid in ranks or [p.pid]:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    try:
        rc = 0
        waiting = list(procs)
        while waiting:
            for p in list(waiting):
                code = p.poll()
                if code is None:
                    continue
                waiting.remove(p)
                if code != 0 and rc == 0:
                    rc = code
                    for other in waiting:  # a node failed: do not leave the others waiting for it
                        other.send_signal(signal.SIGTERM)
            time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if signalled and rc != 0:
        if checkpoint_dir is None:
            return PREEMPTED
        after = complete_checkpoints(checkpoint_dir)
        if any(before.get(tag) != mtime for tag, mtime in after.items()):
            return PREEMPTED
        log.warning(
            f"{name}: signal {signalled[0]}: the ranks stopped (exit {rc}) and no checkpoint was written at the "
            f"signal in {checkpoint_dir}: not exiting {PREEMPTED} (requeue), the run resumes from its last "
            "complete checkpoint"
        )
        return rc if rc != PREEMPTED else 1
    return rc
