"""Batch plan, large-batch LR scaling and the warmup/decay schedule: pure functions of the config."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from runconfig import RunConfig


@dataclass(frozen=True)
class TrainPlan:
    world_size: int
    micro_batch_size: int
    grad_accum: int
    global_batch_size: int
    seq_len: int
    peak_lr: float
    warmup_steps: int
    total_steps: int
    lr_rule: str

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def total_tokens(self) -> int:
        return self.tokens_per_step * self.total_steps

    def describe(self) -> str:
        d = asdict(self) | {"tokens_per_step": self.tokens_per_step, "total_tokens": self.total_tokens}
        return "\n".join(f"  {k:<18} {v}" for k, v in d.items())


def scaled_lr_and_warmup(cfg: RunConfig, global_batch: int) -> tuple[float, int]:
    """Peak LR and warmup for this global batch (pretrain/lr_scaling.py: the rule and its reference recipe)."""
    from pretrain.lr_scaling import scale

    return scale(cfg, global_batch, cfg.schedule.total_steps)


def make_plan(cfg: RunConfig, world_size: int | None = None) -> TrainPlan:
    bp = cfg.batch_plan(world_size)
    lr, warmup = scaled_lr_and_warmup(cfg, bp["global_batch_size"])
    return TrainPlan(
        world_size=bp["world_size"],
        micro_batch_size=bp["micro_batch_size"],
        grad_accum=bp["grad_accum"],
        global_batch_size=bp["global_batch_size"],
        seq_len=cfg.packing.seq_len,
        peak_lr=lr,
        warmup_steps=warmup,
        total_steps=cfg.schedule.total_steps,
        lr_rule=cfg.lr_scaling.rule,
    )


class WarmupDecay:
    """LR multiplier: linear warmup then linear/cosine decay to min_lr_ratio. A class (not a lambda) so that
    LambdaLR's state_dict carries it into checkpoints."""

    def __init__(self, warmup: int, total: int, decay: str, min_ratio: float):
        self.warmup, self.total, self.decay, self.min_ratio = warmup, total, decay, min_ratio

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        if self.decay == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        if self.decay == "linear":
            f = 1.0 - progress
        else:
            f = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * f
