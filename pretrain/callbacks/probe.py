"""The in-loop transfer probe (`eval.probe_task`, pretrain/run/probe_eval.py) as a callback: a frozen-feature linear
probe of a labelled task at each evaluation, with its random-init figure measured once (before the first step of a
fresh run) and carried in the checkpoints, so a resume never measures it on trained weights."""

from __future__ import annotations

from typing import Any

from core.callbacks import Callback


class InLoopProbe(Callback):
    name = "probe"
    section = "eval"

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.saved: dict[str, Any] | None = None

    def enabled(self) -> bool:
        return self.settings.probe_task is not None

    def load_state_dict(self, state: Any, step: int) -> None:
        self.saved = state

    def on_start(self, run: Any, progress: Any) -> dict[str, Any] | None:
        from pretrain.run.probe_eval import TransferProbe
        from pretrain.run.step import rng_isolated

        self.probe = TransferProbe(run.cfg, run.tokenizer, run.rank)
        # a checkpoint from before the callbacks carried their states holds the figure in its own entry
        saved = self.saved or progress.probe_random_init
        with rng_isolated():
            return self.probe.start(run.engine.module, saved, progress.step)

    def on_eval(self, run: Any, step: int) -> dict[str, Any]:
        return self.probe.measure(run.engine.module)  # the loop isolates the RNG around evaluation

    def state_dict(self) -> Any:
        return self.probe.state()
