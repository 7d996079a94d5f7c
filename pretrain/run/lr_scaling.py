"""Large-batch LR scaling made visible: the reference recipe, the rule applied, and a warning whenever a LR or
warmup written in the YAML is replaced.

The reference recipe is the config's own unless stated: `lr_scaling.reference_lr` defaults to `optim.lr` and
`lr_scaling.reference_warmup_steps` to `schedule.warmup_steps`, tuned at `lr_scaling.reference_batch_size`
(required with a rule; the ladder presets state their published batch). A run at the reference batch therefore
keeps the preset's LR and warmup exactly.
"""

from __future__ import annotations

import math

from runconfig import RunConfig


def reference_recipe(cfg: RunConfig) -> tuple[float, int, int | None]:
    """(reference LR, reference warmup steps, reference global batch)."""
    s = cfg.lr_scaling
    lr = s.reference_lr if s.reference_lr is not None else cfg.optim.lr
    warmup = s.reference_warmup_steps if s.reference_warmup_steps is not None else cfg.schedule.warmup
    return lr, warmup, s.reference_batch_size


def scale(cfg: RunConfig, global_batch: int, total_steps: int | None) -> tuple[float, int]:
    """Linear (Goyal et al. 2017) or square-root (Krizhevsky 2014; You et al. 2019 for LAMB) LR scaling from the
    reference recipe, capped by max_lr; warmup is scaled inversely so the same number of samples are warmed.
    `total_steps` None is a time-budget run: its warmup is `schedule.warmup_fraction` of the clock (0 steps)."""
    s = cfg.lr_scaling
    if s.rule == "none":
        return cfg.optim.lr, cfg.schedule.warmup
    ref_lr, ref_warmup, ref_batch = reference_recipe(cfg)
    assert ref_batch is not None  # the config validator requires it with a rule
    k = global_batch / ref_batch
    lr = ref_lr * (k if s.rule == "linear" else math.sqrt(k))
    if s.max_lr is not None:
        lr = min(lr, s.max_lr)
    if total_steps is None:
        return lr, 0
    warmup = max(1, round(ref_warmup / k)) if ref_warmup else 0
    return lr, min(warmup, total_steps)


def explain(cfg: RunConfig, global_batch: int, lr: float, warmup: int) -> tuple[list[str], list[str]]:
    """(lines describing the reference recipe and the rule, warnings for explicit values that were replaced)."""
    s = cfg.lr_scaling
    budget = cfg.schedule.budget_s
    # a time-budget run warms up over a fraction of its clock: its step count (0) is not its warmup
    clock = (
        f"warmup {cfg.schedule.warmup_fraction if cfg.schedule.warmup_fraction is not None else 0.05:.0%} of the "
        f"{budget / 60:g}-minute budget (schedule.warmup_fraction; LR follows the clock)"
        if budget is not None
        else None
    )
    if s.rule == "none":
        if clock:
            return [f"lr_scaling: none (peak LR {lr:.3g} = optim.lr, {clock})"], []
        source = (
            "schedule.warmup_steps"
            if cfg.schedule.warmup_steps is not None
            else "schedule.warmup_fraction"
            if cfg.schedule.warmup_fraction is not None
            else "the default warmup"
        )
        return [f"lr_scaling: none (peak LR {lr:.3g} = optim.lr, warmup {warmup} = {source})"], []
    ref_lr, ref_warmup, ref_batch = reference_recipe(cfg)
    k = global_batch / (ref_batch or global_batch)
    src_lr = "lr_scaling.reference_lr" if s.reference_lr is not None else "optim.lr"
    src_wu = (
        "lr_scaling.reference_warmup_steps"
        if s.reference_warmup_steps is not None
        else "schedule.warmup_steps"
    )
    factor = k if s.rule == "linear" else math.sqrt(k)
    lines = [
        f"lr_scaling: reference recipe LR {ref_lr:.3g} ({src_lr})"
        + ("" if clock else f", warmup {ref_warmup} steps ({src_wu})")
        + f" at global batch {ref_batch} (lr_scaling.reference_batch_size)",
        f"lr_scaling: rule {s.rule}: batch {global_batch} = {k:.3g} x reference -> LR x {factor:.3g} = {lr:.3g}"
        + (
            f" (capped by lr_scaling.max_lr {s.max_lr:.3g})"
            if s.max_lr is not None and lr == s.max_lr
            else ""
        )
        + (f", {clock}" if clock else f", warmup / {k:.3g} = {warmup} steps"),
    ]
    warnings = []
    if "lr" in cfg.optim.model_fields_set and not math.isclose(lr, cfg.optim.lr, rel_tol=1e-9):
        warnings.append(
            f"warning: optim.lr {cfg.optim.lr:.3g} set in the config is replaced by {lr:.3g} from "
            f"lr_scaling.rule={s.rule}; set lr_scaling.rule=none to keep it"
        )
    if "warmup_steps" in cfg.schedule.model_fields_set and warmup != cfg.schedule.warmup_steps:
        warnings.append(
            f"warning: schedule.warmup_steps {cfg.schedule.warmup_steps} set in the config is replaced "
            f"by {warmup} from lr_scaling.rule={s.rule}; set lr_scaling.rule=none to keep it"
        )
    return lines, warnings
