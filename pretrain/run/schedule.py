"""Batch plan, large-batch LR scaling and the warmup/decay schedule (in steps or in elapsed time): pure
functions of the config."""

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
    total_steps: int | None  # None: a time-budget run (budget_s)
    lr_rule: str
    budget_s: float | None = None
    warmup_fraction: float = 0.0  # of the time budget
    phases: str = ""  # the schedule's phases in words (`pretrain plan`, the card)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def total_tokens(self) -> int | None:
        return None if self.total_steps is None else self.tokens_per_step * self.total_steps

    def describe(self) -> str:
        d = asdict(self) | {"tokens_per_step": self.tokens_per_step, "total_tokens": self.total_tokens}
        if self.budget_s is not None:  # warmup follows the clock: its step count is unused
            d.pop("warmup_steps")
            d["warmup_fraction"] = f"{self.warmup_fraction:.0%} of the {self.budget_s / 60:g}-minute budget"
        return "\n".join(f"  {k:<18} {v}" for k, v in d.items())


def scaled_lr_and_warmup(cfg: RunConfig, global_batch: int) -> tuple[float, int]:
    """Peak LR and warmup for this global batch (pretrain/run/lr_scaling.py: the rule and its reference recipe)."""
    from pretrain.run.lr_scaling import scale

    return scale(cfg, global_batch, cfg.schedule.steps)


def make_plan(cfg: RunConfig, world_size: int | None = None) -> TrainPlan:
    bp = cfg.batch_plan(world_size)
    lr, warmup = scaled_lr_and_warmup(cfg, bp["global_batch_size"])
    warmup_fraction = (
        (0.05 if cfg.schedule.warmup_fraction is None else cfg.schedule.warmup_fraction)
        if cfg.schedule.budget_s is not None
        else 0.0
    )
    return TrainPlan(
        world_size=bp["world_size"],
        micro_batch_size=bp["micro_batch_size"],
        grad_accum=bp["grad_accum"],
        global_batch_size=bp["global_batch_size"],
        seq_len=cfg.packing.seq_len,
        peak_lr=lr,
        warmup_steps=warmup,
        total_steps=cfg.schedule.steps,
        lr_rule=cfg.lr_scaling.rule,
        budget_s=cfg.schedule.budget_s,
        warmup_fraction=warmup_fraction,
        phases=describe_phases(cfg, warmup, warmup_fraction),
    )


def describe_phases(cfg: RunConfig, warmup: int, warmup_fraction: float) -> str:
    """'warmup to step 20, stable to 160, decay to 200 (1-sqrt, to 0x the peak)': in steps, or in minutes of a
    time budget."""
    sc = cfg.schedule
    if sc.budget_s is None:
        total, w, at, unit = float(sc.steps or 0), float(warmup), "step ", ""
        start = float(sc.wsd_decay_start) if sc.decay == "wsd" else w
    else:
        total, at, unit = sc.budget_s / 60, "", " min"
        w = warmup_fraction * total
        start = total * (1 - sc.wsd_fraction) if sc.decay == "wsd" else w
    parts = [f"warmup to {at}{w:g}{unit}"] if w else []
    if sc.decay == "constant":
        return ", ".join([*parts, f"constant to {at if not parts else ''}{total:g}{unit}"])
    if start > w:
        parts.append(f"stable to {at if not parts else ''}{start:g}{unit}")
    shape = sc.wsd_shape if sc.decay == "wsd" else sc.decay
    lead = at if not parts else ""
    parts.append(f"decay to {lead}{total:g}{unit} ({shape}, to {sc.min_lr_ratio:g}x the peak)")
    return ", ".join(parts)


def _decayed(progress: float, decay: str, min_ratio: float) -> float:
    """Multiplier after warmup at `progress` in [0, 1] of the decay phase."""
    if decay == "constant":
        return 1.0
    progress = min(1.0, max(0.0, progress))
    if decay == "linear":
        f = 1.0 - progress
    elif decay == "1-sqrt":
        f = 1.0 - math.sqrt(progress)
    else:
        f = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * f


class WarmupDecay:
    """LR multiplier: linear warmup then linear/cosine decay to min_lr_ratio. A class (not a lambda) so that
    LambdaLR's state_dict carries it into checkpoints."""

    def __init__(self, warmup: int, total: int, decay: str, min_ratio: float):
        self.warmup, self.total, self.decay, self.min_ratio = warmup, total, decay, min_ratio

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        return _decayed((step - self.warmup) / max(1, self.total - self.warmup), self.decay, self.min_ratio)


class WarmupStableDecay:
    """Warmup, the peak held through the stable phase, then a cool-down from `decay_start` to `total` (linear,
    cosine or 1-sqrt) to min_ratio. `decay_start` is the run's own (its last `schedule.decay_fraction`) or a
    decay branch's starting step: the stable phase's LR does not depend on when its cool-down comes, so a
    branch started at step S repeats a run whose cool-down started at S exactly."""

    def __init__(self, warmup: int, decay_start: int, total: int, shape: str, min_ratio: float):
        self.warmup, self.decay_start, self.total = warmup, decay_start, total
        self.shape, self.min_ratio = shape, min_ratio

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        if step < self.decay_start:
            return 1.0
        span = max(1, self.total - self.decay_start)
        return _decayed((step - self.decay_start) / span, self.shape, self.min_ratio)


class TimeWarmupDecay:
    """The same shape over elapsed training seconds (Cramming): the loop sets `elapsed_s` (rank 0's clock,
    agreed by every rank) before each optimizer step, so the LR reaches its floor when the budget is spent
    whatever the step rate. LambdaLR's step argument is ignored; the attributes ride in its state_dict."""

    def __init__(
        self,
        budget_s: float,
        warmup_fraction: float,
        decay: str,
        min_ratio: float,
        decay_fraction: float = 0.2,
        shape: str = "1-sqrt",
    ):
        self.budget_s, self.warmup_s = budget_s, warmup_fraction * budget_s
        self.decay, self.min_ratio = decay, min_ratio
        # wsd: the cool-down is the budget's last decay_fraction, in `shape`; other decays start after warmup
        self.decay_start_s = budget_s * (1 - decay_fraction) if decay == "wsd" else self.warmup_s
        self.shape = shape if decay == "wsd" else decay
        self.elapsed_s = 0.0

    def __call__(self, _step: int) -> float:
        t = self.elapsed_s
        if self.warmup_s and t < self.warmup_s:
            return max(t / self.warmup_s, 1e-3)
        if t < self.decay_start_s:
            return 1.0
        span = max(1e-9, self.budget_s - self.decay_start_s)
        return _decayed((t - self.decay_start_s) / span, self.shape, self.min_ratio)


def lr_multiplier(cfg: RunConfig, plan: TrainPlan) -> WarmupDecay | WarmupStableDecay | TimeWarmupDecay:
    """The schedule the engine's LambdaLR follows: counted in steps, or in seconds for a time budget."""
    sc = cfg.schedule
    if plan.budget_s is not None:
        return TimeWarmupDecay(
            plan.budget_s, plan.warmup_fraction, sc.decay, sc.min_lr_ratio, sc.wsd_fraction, sc.wsd_shape
        )
    total = plan.total_steps
    assert total is not None  # a step-counted run (a time budget returned above)
    if sc.decay == "wsd":
        return WarmupStableDecay(plan.warmup_steps, sc.wsd_decay_start, total, sc.wsd_shape, sc.min_lr_ratio)
    return WarmupDecay(plan.warmup_steps, total, sc.decay, sc.min_lr_ratio)
