"""Preemption as a callback: SIGTERM/SIGUSR1 (preemption, scancel, Slurm's grace signal) and SIGINT (Ctrl-C; plain
torchrun passes it to the ranks) ask for a checkpoint at the next step end and an exit for requeue (PREEMPTED).

The signal reaches some ranks only, so it is a vote: summed in the step's one all-reduce, every rank sees it at the
same step and checkpoints that step. A second SIGINT stops at once.
"""

from __future__ import annotations

import signal
from typing import Any, ClassVar

from core.callbacks import CONTINUE, Action, Callback, StepOutcome


class StopRequested:
    """The signal handlers: the first signal is remembered (`signum`), a second SIGINT raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(s, self._handler)

    def _handler(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    @property
    def requested(self) -> bool:
        """This rank was signalled; all ranks agree through StepSync so they stop at the same step."""
        return self.signum is not None


class Preemption(Callback):
    """Checkpoint and exit for requeue at the step every rank agreed a signal arrived."""

    name = "preemption"
    always: ClassVar[bool] = True
    votes: ClassVar[bool] = True

    def __init__(self, settings: Any = None) -> None:
        super().__init__(None)  # no settings: the signals are the scheduler's
        self.stop = StopRequested()  # from set-up on: a signal during start-up is acted on at the first step

    def vote(self) -> float:
        return 1.0 if self.stop.requested else 0.0

    def on_step_end(self, outcome: StepOutcome) -> Action:
        if outcome.votes.get(self.key, 0.0) > 0:
            return Action.requeue(f"signal {self.stop.signum}")
        return CONTINUE
