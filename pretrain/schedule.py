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
    """Linear (Goyal et al. 2017) or square-root (Krizhevsky 2014; You et al. 2019 for LAMB) LR scaling from a
    reference recipe, capped by max_lr; warmup is scaled inversely so the same number of samples are warmed."""
    s = cfg.lr_scaling
    if s.rule == "none":
        return cfg.optim.lr, cfg.schedule.warmup_steps
    k = global_batch / s.reference_batch_size
    lr = s.reference_lr * (k if s.rule == "linear" else math.sqrt(k))
    if s.max_lr is not None:
        lr = min(lr, s.max_lr)
    warmup = max(1, round(s.reference_warmup_steps / k))
    return lr, min(warmup, cfg.schedule.total_steps)


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
