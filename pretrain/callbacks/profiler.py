"""The profiler window (`logging.profile_steps`, pretrain/run/profiler.py) as a callback: a torch.profiler trace and
its summary of the steps in the window; a window the run ends inside is written all the same."""

from __future__ import annotations

from typing import Any

from core.callbacks import CONTINUE, Action, Callback, StepOutcome


class ProfilerWindow(Callback):
    name = "profiler"
    section = "logging"

    def enabled(self) -> bool:
        return self.settings.profile_steps is not None

    def on_start(self, run: Any, progress: Any) -> None:
        from pretrain.run.profiler import StepProfiler

        self.profiler = StepProfiler(self.settings.profile_steps, run.layout.logs, run.rank, run.device)

    def on_step_begin(self, step: int) -> None:
        self.profiler.begin(step)

    def on_step_end(self, outcome: StepOutcome) -> Action:
        self.profiler.end(outcome.step)
        return CONTINUE

    def on_end(self, run: Any, progress: Any) -> None:
        self.profiler.end(progress.step, finished=True)
