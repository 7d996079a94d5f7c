"""The hang watchdog and straggler report (pretrain/run/watchdog.py) as a callback; its settings: `watchdog.*`.

It starts with the loop (its heartbeat thread, the engine's forward hooks), beats at each step's start and end,
adds the per-rank step figures to each logging row, and stops its thread at the run's end.
"""

from __future__ import annotations

from typing import Any

from core.callbacks import CONTINUE, Action, Callback, StepOutcome


class HangWatchdog(Callback):
    name = "watchdog"
    section = "watchdog"

    def on_start(self, run: Any, progress: Any) -> None:
        from pretrain.run.watchdog import Watchdog

        self.dog = Watchdog.start(run.cfg, run.engine, run.layout.hang)

    def on_step_begin(self, step: int) -> None:
        self.dog.beat(step, "data")

    def on_step_end(self, outcome: StepOutcome) -> Action:
        self.dog.beat(outcome.step, "after")
        return CONTINUE

    def metrics(self, step: int, loader_wait_s: float) -> dict[str, float]:
        return self.dog.step_figures(step, loader_wait_s)

    def on_end(self, run: Any, progress: Any) -> None:
        self.dog.stop()
