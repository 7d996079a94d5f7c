"""Resuming with a changed config: apply what is safe to apply and say so, refuse the rest.

A checkpoint records the resolved config it was written with (in COMPLETE). On resume the current config is
compared key by key with it, as Megatron does with its checkpoint args. Each changed key is looked up by its
longest registered dotted prefix in `POLICIES`: "apply" keys take effect (the LR schedule and optimizer
hyper-parameters are re-derived from the current config at the checkpoint's step, see `reapply_schedule`);
any other change stops the run with every differing key, its old and new value, and the flag that accepts them.
New schedule keys (e.g. a time budget) are covered by the `schedule` prefix without an entry of their own.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from core.errors import CannotContinueError
from runconfig.removed import is_former_default

ACCEPT_FLAG = "checkpoint.accept_config_changes=true"
RESET_FLAG = "--reset-data-order"

# Keys the sample order is a function of (the loader's fingerprint: token shards, packing, source weights,
# seed). A checkpoint's loader position means nothing under another order, so a change is refused even with
# ACCEPT_FLAG; RESET_FLAG (checkpoint.reset_data_order) keeps the weights and starts the new order afresh.
DATA_ORDER = ("run.seed", "tokenizer", "data.sources", "packing")

# Dotted prefix -> what happens when such a key differs from the checkpoint's. The longest prefix wins.
POLICIES: Mapping[str, str] = MappingProxyType(
    {
        "run": "apply",
        "checkpoint": "apply",
        "logging": "apply",
        "eval": "apply",
        "finetune": "apply",
        "launch": "apply",  # another world size goes through the universal checkpoint
        "schedule": "apply",  # the LR schedule is re-derived at the checkpoint's step
        "lr_scaling": "apply",
        "optim.lr": "apply",
        "optim.betas": "apply",
        "optim.eps": "apply",
        "optim.weight_decay": "apply",
        "optim.grad_clip": "apply",
        "deepspeed.comm_timeout_s": "apply",
        "deepspeed.max_consecutive_bad_steps": "apply",
        "deepspeed.compile": "apply",  # compilation changes no state
        "deepspeed.compile_backend": "apply",
        "objective.chunked_loss": "apply",  # the same loss and gradients, computed a chunk of tokens at a time
        "loader.num_workers": "apply",
        "spikes": "apply",  # the detector's window is restored when its size is unchanged, else started afresh
        "watchdog": "apply",  # limits and periods only: no state
        "callbacks": "apply",  # outside callbacks: a new one starts afresh, a dropped one's state is left behind
    }
)
_NOTES: Mapping[str, str] = MappingProxyType(
    {
        "schedule": "the LR schedule is re-derived from the current step",
        "lr_scaling": "the scaled peak LR and warmup are re-derived",
        "optim.lr": "the new peak LR takes effect now",
        "optim": "set on every optimizer parameter group",
        "spikes.window": "the detector's window starts afresh",
    }
)
_ABSENT = "<absent>"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts/lists -> {"a.b.0.c": value}."""
    if isinstance(d, dict):
        items = d.items()
    elif isinstance(d, list | tuple) and any(isinstance(x, dict | list) for x in d):
        items = ((str(i), x) for i, x in enumerate(d))
    else:
        return {prefix: list(d) if isinstance(d, tuple) else d}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def policy(key: str) -> str:
    if any(key == p or key.startswith(p + ".") for p in DATA_ORDER):
        return "data_order"
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        p = ".".join(parts[:n])
        if p in POLICIES:
            return POLICIES[p]
    return "refuse"


def note(key: str) -> str:
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        if (p := ".".join(parts[:n])) in _NOTES:
            return f" ({_NOTES[p]})"
    return ""


@dataclass
class ConfigChanges:
    applied: list[tuple[str, Any, Any]] = field(default_factory=list)
    refused: list[tuple[str, Any, Any]] = field(default_factory=list)
    unknown_before: list[str] = field(default_factory=list)  # keys the checkpoint's config did not have
    # reset with checkpoint.reset_data_order
    data_order: list[tuple[str, Any, Any]] = field(default_factory=list)

    def describe(self) -> str:
        lines = []
        if self.data_order:
            lines.append(
                f"[train] data order reset ({RESET_FLAG}): the loader starts the new order from its "
                "beginning; weights, optimizer and step are resumed:"
            )
            lines += [f"  {k}: {old!r} -> {new!r}" for k, old, new in self.data_order]
        if self.applied:
            lines.append("[train] config changes since the checkpoint, applied:")
            lines += [f"  {k}: {old!r} -> {new!r}{note(k)}" for k, old, new in self.applied]
        if self.refused:
            lines.append("[train] config changes since the checkpoint, accepted with " + ACCEPT_FLAG + ":")
            lines += [f"  {k}: {old!r} -> {new!r}" for k, old, new in self.refused]
        return "\n".join(lines)


def data_order_message(rows: list[tuple[str, Any, Any]], step: int) -> str:
    keys = "\n".join(f"  {k}: checkpoint {a!r}, now {b!r}" for k, a, b in rows)
    return (
        f"the data order changed since the checkpoint (step {step}); the saved loader position cannot continue "
        f"it:\n{keys}\nEither restore these keys, start a new output folder (another run.output_dir) to train "
        f"from scratch, or rerun with {RESET_FLAG} (checkpoint.reset_data_order=true) to keep the resumed "
        "weights and start the new data order from its beginning"
    )


def compare(
    old_cfg: dict[str, Any] | None,
    new_cfg: dict[str, Any],
    step: int,
    accept: bool,
    reset_data_order: bool = False,
) -> ConfigChanges:
    """The differences between the checkpoint's config and the current one; CannotContinueError when a change is
    refused (and not accepted), a data-order key changed without `reset_data_order`, or the schedule would end
    before the checkpoint's step."""
    changes = ConfigChanges()
    if old_cfg is None:  # a checkpoint written before configs were recorded: nothing to compare
        return changes
    old, new = flatten(old_cfg), flatten(new_cfg)
    for key in sorted(set(old) | set(new)):
        if key not in old:
            changes.unknown_before.append(key)
            continue
        a, b = old[key], new.get(key, _ABSENT)
        # A key removed from the schema at its former default: the checkpoint's value is what is built in now.
        if a == b or (key not in new and is_former_default(key, a)):
            continue
        kind = policy(key)
        bucket = {"apply": changes.applied, "data_order": changes.data_order}.get(kind, changes.refused)
        bucket.append((key, a, b))
    total = new_cfg.get("schedule", {}).get("total_steps")
    if isinstance(total, int) and total < step:
        raise CannotContinueError(
            f"schedule.total_steps ({total}) is below the checkpoint's step {step}: "
            "nothing would be trained; raise schedule.total_steps"
        )
    problems = []  # every refused key in one message, so one rerun fixes them all
    if changes.data_order and not reset_data_order:
        problems.append(data_order_message(changes.data_order, step))
    if changes.refused and not accept:
        rows = "\n".join(f"  {k}: checkpoint {a!r}, now {b!r}" for k, a, b in changes.refused)
        problems.append(
            f"the config differs from the checkpoint's (step {step}) in keys that cannot be changed safely on "
            f"resume:\n{rows}\nRestore them, or rerun with {ACCEPT_FLAG} to resume with the new values anyway."
        )
    if problems:
        raise CannotContinueError("\n".join(problems))
    return changes


# --- applying the schedule and optimizer hyper-parameters of the current config after a load ---------------
_GROUP_KEEP = ("params", "lr", "initial_lr")


def schedule_snapshot(scheduler) -> dict[str, Any]:
    """The LR schedule and optimizer hyper-parameters as built from the current config (take it before the
    checkpoint is loaded: loading restores the old ones, which silently ignored any change)."""
    return {
        "base_lrs": list(scheduler.base_lrs),
        "lambdas": [copy.deepcopy(fn.__dict__) for fn in scheduler.lr_lambdas],
        "groups": [
            {k: copy.deepcopy(v) for k, v in g.items() if k not in _GROUP_KEEP}
            for g in scheduler.optimizer.param_groups
        ],
    }


def reapply_schedule(scheduler, snap: dict[str, Any]) -> None:
    """Put the current config's schedule back after a load and derive the LR at the restored step (the same
    arithmetic as LambdaLR.get_lr, so an unchanged config resumes bit-exactly)."""
    scheduler.base_lrs = list(snap["base_lrs"])
    for fn, state in zip(scheduler.lr_lambdas, snap["lambdas"], strict=True):
        fn.__dict__.update(copy.deepcopy(state))
    groups = scheduler.optimizer.param_groups
    for g, hp, base, fn in zip(groups, snap["groups"], scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        g.update(copy.deepcopy(hp))
        g["initial_lr"] = base
        g["lr"] = base * fn(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in groups]
