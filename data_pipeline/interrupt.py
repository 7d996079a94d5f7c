"""Stop signals of the data stages: SIGINT (Ctrl-C) and SIGTERM (`kill`, a scheduler) end a stage cleanly.

In the stage's main process both raise `StageInterrupted` wherever it is, so the atomic writers on the way out
remove their temporary files (core/io.py); the command prints one line and exits 128 + the signal (130, 143),
the shell's convention. Pool workers ignore both: the driver stops handing out tasks and waits for the ones in
hand, which end with their completion markers written, so a rerun skips them. A second signal stops the driver
without waiting (the workers finish their task, then exit); a SIGKILL ends everything at once, and the next
run of the stage removes the temporary files it left (`shards.remove_stale_temps`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

from core.exit_codes import stopped_by

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StageInterrupted(BaseException):
    """A stop signal arrived. A BaseException like KeyboardInterrupt, so a task guard's `except Exception`
    (which retries a failing task) does not take it for a task failure."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return stopped_by(self.signum)


_driver_pid: int | None = None  # the process whose stop_signals() installed _raise


def _raise(signum: int, _frame) -> None:
    # A forked pool worker inherits this handler and keeps it until its initializer sets SIG_IGN; a signal sent
    # to the process group in between must not stop it either: the driver alone decides (module docstring).
    if os.getpid() != _driver_pid:
        return
    raise StageInterrupted(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """While the block runs (in the main thread), SIGINT and SIGTERM raise StageInterrupted."""
    global _driver_pid
    _driver_pid = os.getpid()
    old = {s: signal.signal(s, _raise) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def ignore_stop_signals() -> None:
    """Pool worker initializer: the driver alone decides when to stop (see the module docstring)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def process_pool(workers: int, mp_context) -> Iterator[ProcessPoolExecutor]:
    """A process pool whose workers ignore stop signals and which, when the driver leaves on any exception (a
    StageInterrupted included), cancels the tasks not started yet instead of running them all first, as
    `with ProcessPoolExecutor()` would."""
    pool = ProcessPoolExecutor(workers, mp_context=mp_context, initializer=ignore_stop_signals)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def stage_of(argv: list[str] | None) -> str:
    """The stage a `python -m data_pipeline` command line names, for the interruption message."""
    args = sys.argv[1:] if argv is None else argv
    return next((a for a in args if not a.startswith("-")), "stage")
