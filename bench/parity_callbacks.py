"""bench/loss_parity.py's two callbacks, registered on our run as any outside callback is: `module.path:Name` under
the run config's `callbacks:` (bench/loss_parity.py passes them on our side only; the reference loop never sees
them). Nothing of them is in the product: with neither named, the loop runs exactly as in every real run.

- `ParityRecorder` (settings: `folder`): what a reference loop needs to replay our run exactly. Rank 0 writes the
  weights the run starts from (init.pt: the engine's module before the first step, which DeepSpeed has broadcast
  from rank 0); every rank writes rank<r>.pt at the end with each micro-batch it trained on (the collator's output:
  masks, spans, labels as data), the CPU RNG state just before its forward (dropout and ELECTRA's generator
  samples replay from it), the plan and the per-step losses.
- `Sabotage` (settings: `mode`): breaks one thing on our side, so that the bench proves it notices:
    warmup     - the LR starts at its peak (the schedule's warmup forced to 0)
    drop_micro - rank 0's first micro-batch of every step contributes no gradient (its loss is still logged)
    sum_ranks  - the loss is summed over ranks instead of averaged (gradient and logged loss x world size)
    no_clip    - gradient clipping is not applied
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from core.callbacks import CONTINUE, Action, Callback, StepOutcome

SABOTAGES = ("warmup", "drop_micro", "sum_ranks", "no_clip")
MODULE = "bench.parity_callbacks"  # as our run imports it (the repository root on PYTHONPATH)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecorderSettings(_Settings):
    folder: str  # where init.pt and rank<r>.pt are written


class ParityRecorder(Callback):
    name = "parity_recorder"
    Settings: ClassVar[type[BaseModel]] = RecorderSettings

    def on_start(self, run: Any, progress: Any) -> None:
        import torch

        from core.io import atomic_write

        self.folder, self.rank, self.plan = Path(self.settings.folder), run.rank, dict(run.plan.__dict__)
        self.micro: list[dict[str, Any]] = []
        self.losses: list[float] = []
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            state = {k: v.detach().clone() for k, v in run.engine.module.state_dict().items()}
            atomic_write(self.folder / "init.pt", lambda f: torch.save(state, f))

    def on_batch(self, step: int, micro: int, batch: dict[str, Any]) -> None:
        import torch

        self.micro.append(
            {
                "step": step,
                "micro": micro,
                "rng": torch.get_rng_state(),
                "batch": {k: v.clone() for k, v in batch.items()},
            }
        )

    def on_step_end(self, outcome: StepOutcome) -> Action:
        self.losses.append(float(outcome.loss))
        return CONTINUE

    def on_end(self, run: Any, progress: Any) -> None:
        import torch

        from core.io import atomic_write

        data = {"rank": self.rank, "micro": self.micro, "losses": self.losses, "plan": self.plan}
        atomic_write(self.folder / f"rank{self.rank}.pt", lambda f: torch.save(data, f))


class SabotageSettings(_Settings):
    mode: Literal["warmup", "drop_micro", "sum_ranks", "no_clip"]


class Sabotage(Callback):
    """Breaks our engine from the outside, at the run's start: a replaced schedule, a wrapped backward or forward,
    clipping switched off on the engine and its ZeRO optimizer."""

    name = "parity_sabotage"
    Settings: ClassVar[type[BaseModel]] = SabotageSettings

    def on_start(self, run: Any, progress: Any) -> None:
        getattr(self, f"_{self.settings.mode}")(run)

    @staticmethod
    def _warmup(run: Any) -> None:
        from pretrain.run.schedule import lr_multiplier

        sched = run.scheduler
        fresh = lr_multiplier(run.cfg, dataclasses.replace(run.plan, warmup_steps=0))
        for f in sched.lr_lambdas:
            f.__dict__.update(fresh.__dict__)
        lrs = [base * fresh(sched.last_epoch) for base in sched.base_lrs]
        for group, lr in zip(sched.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        sched._last_lr = lrs

    @staticmethod
    def _no_clip(run: Any) -> None:
        run.engine._config.gradient_clipping = 0.0  # ZeRO 0: the engine clips
        if hasattr(run.engine.optimizer, "clip_grad"):  # ZeRO 1/2: the optimizer clips
            run.engine.optimizer.clip_grad = 0.0

    @staticmethod
    def _sum_ranks(run: Any) -> None:
        world = run.world

        def scaled(_module: Any, _args: Any, output: Any) -> Any:
            if _module.training:
                output.loss = output.loss * world
            return output

        run.engine.register_forward_hook(scaled)

    @staticmethod
    def _drop_micro(run: Any) -> None:
        if run.rank != 0:
            return
        engine, accum, calls = run.engine, run.plan.grad_accum, [0]
        backward = engine.backward

        def dropped(loss: Any, *args: Any, **kwargs: Any) -> Any:
            first = calls[0] % accum == 0
            calls[0] += 1
            if first:  # a loss whose gradient is exactly zero: every collective still runs
                loss = sum(p.sum() * 0.0 for p in engine.module.parameters() if p.requires_grad)
            return backward(loss, *args, **kwargs)

        engine.backward = dropped


def callbacks_override(record: Path, sabotage: str | None) -> str:
    """The override that switches them on for our run: `callbacks={...}` (JSON is YAML)."""
    import json

    chosen: dict[str, dict[str, str]] = {f"{MODULE}:ParityRecorder": {"folder": str(record)}}
    if sabotage:
        chosen[f"{MODULE}:Sabotage"] = {"mode": sabotage}
    return "callbacks=" + json.dumps(chosen)
