"""The loss-spike policy (`spikes.*`, pretrain/run/spikes.py) as a callback.

The detector judges the agreed step loss on the device after the step's all-reduce (`judge`), so a spiking step's
update is withheld on every rank before it is applied; after the step's host read it decides, alike on every rank:
go on (skip), roll back to the last complete checkpoint (the loop reloads it and hands back the detector's window
as it was then), or stop with exit code LOSS_SPIKE. Rollbacks to one checkpoint are bounded by
`spikes.max_rollbacks`: a trigger that recurs after each reload stops the run instead of looping.
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.callbacks import CONTINUE, Action, Callback, StepOutcome
from core.exit_codes import LOSS_SPIKE


class SpikePolicy(Callback):
    name = "spikes"
    section = "spikes"
    judges: ClassVar[bool] = True

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.saved: dict[str, Any] | None = None
        self.asked = False  # this callback asked for the rollback the loop is carrying out

    def enabled(self) -> bool:
        return self.settings.action != "none"

    def load_state_dict(self, state: Any, step: int) -> None:
        self.saved = state

    def on_start(self, run: Any, progress: Any) -> None:
        from pretrain.run.spikes import SpikeDetector

        self.detector = SpikeDetector(self.settings, run.device, run.rank, run.plan.grad_accum * run.world)
        self.detector.load_state_dict(self.saved, progress.step)

    def judge(self, loss_sum: Any, n_bad: Any, per_step: int) -> Any:
        return self.detector.judge(loss_sum, n_bad)

    def on_step_end(self, outcome: StepOutcome) -> Action:
        from pretrain.run.spikes import LossSpikeStop

        det = self.detector
        try:
            again = det.handle(outcome.step, outcome.withheld.get(self.key, False), outcome.loss, outcome.ok)
        except LossSpikeStop as e:
            return Action.stop(str(e), LOSS_SPIKE)
        if not again:
            return CONTINUE
        self.asked = True
        return Action.rollback(
            f"{det.cause} at step {outcome.step}",
            self.settings.max_rollbacks,
            LOSS_SPIKE,
            "spikes.max_rollbacks",
        )

    def on_restore(self, state: Any, step: int, record: dict[str, Any] | None = None) -> None:
        asked, self.asked = self.asked, False
        if record is None:  # no complete checkpoint yet: the step was skipped
            self.detector.skipped += int(asked)
            return
        self.detector.restore_window(state)
        if asked:
            self.detector.rollbacks.append(record)
        self.detector.step, self.detector.consecutive = step, 0

    def metrics(self, step: int, loader_wait_s: float) -> dict[str, Any]:
        return self.detector.metrics()

    def state_dict(self) -> Any:
        return self.detector.state_dict()  # a host read: checkpoint steps only
