"""Loss spikes, handled alike on every rank (config `spikes`, docs/recovery.md).

The detector judges the step loss that StepSync has already all-reduced, on the device, before the optimizer step:
every rank computes the same flag from the same figures, so no rank can decide alone (the failure reported for
spike checks taken on rank 0 only), and the check costs no collective and no host read. The flag joins StepGuard's
non-finite flag, so a spiking step's update is never applied; the loop learns of it in the step's one host read
(StepSync.read) and then, by `spikes.action`, goes on (skip), reloads the last complete checkpoint and leaves the
data since it behind (rollback), or stops with exit code LOSS_SPIKE (stop).

The rule is OLMo-core's skip-step rule (optim/skip_step_optimizer.py): a spike is a finite loss above the mean
plus `sigma` standard deviations of the last `window` losses, judged once half the window is filled. Unlike it,
spiking and non-finite losses stay out of the window, so one spike does not widen the band that hides the next;
`max_consecutive` spikes in a row stop the run instead (the loss has moved for good).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from core.errors import CannotContinueError
from core.exit_codes import LOSS_SPIKE
from core.log import get_logger
from pretrain.checkpoint.meta import TAG_RE

log = get_logger(__name__)

# Test-only: "<rank>:<step>:<factor>" multiplies that rank's summed loss at that step by factor before the
# all-reduce (a spike seen by one rank only). Read once when the detector is built; not a config key.
INJECT_ENV = "LMSTACK_SPIKE_INJECT"


class LossSpikeStop(CannotContinueError):
    """The run stopped on a loss spike (spikes.action stop, or spikes.max_consecutive in a row)."""

    exit_code = LOSS_SPIKE


def _injection(rank: int) -> tuple[int, float] | None:
    text = os.environ.get(INJECT_ENV, "").strip()
    if not text:
        return None
    try:
        r, step, factor = text.split(":")
        at = (int(step), float(factor))
    except ValueError:
        raise ValueError(f"{INJECT_ENV}={text!r} is not <rank>:<step>:<factor>") from None
    return at if int(r) == rank else None


class SpikeDetector:
    """The running window on the device, the per-step judgement (device) and the action taken (host)."""

    def __init__(self, cfg: Any, device: torch.device, rank: int, per_step: int):
        self.cfg = cfg.spikes if hasattr(cfg, "spikes") else cfg
        self.enabled = self.cfg.action != "none"
        self.per_step = per_step  # micro-batch losses summed over ranks in one step (grad_accum x world)
        self.rank = rank
        n = self.cfg.window
        self.losses = torch.zeros(n, device=device, dtype=torch.float64)
        self.count = torch.zeros(
            (), device=device, dtype=torch.float64
        )  # losses ever kept (slot = count % n)
        self.slots = torch.arange(n, device=device, dtype=torch.float64)
        self.injection = _injection(rank)
        self.step = 0  # the last step handled (host)
        self.spikes = self.skipped = self.consecutive = 0
        self.rollbacks: list[dict[str, int]] = []
        self.cause = "loss spike"  # what the last rollback was for (a spike, or a non-finite loss)

    # --- device side: no host read ---------------------------------------------------------------------------
    def local(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """This rank's summed loss for the coming step, as it enters the all-reduce (test-only injection)."""
        if self.injection is not None and self.injection[0] == self.step + 1:
            factor, self.injection = self.injection[1], None  # once: a rollback's rerun of the step is clean
            return loss_sum * factor
        return loss_sum

    def judge(self, loss_sum_all: torch.Tensor, n_bad_all: torch.Tensor) -> torch.Tensor:
        """1.0 (float64, on the device) when the agreed step loss spikes, else 0.0; a kept loss joins the window."""
        if not self.enabled:
            return torch.zeros_like(loss_sum_all)
        loss = loss_sum_all / self.per_step
        size = self.slots.numel()
        n = self.count.clamp(max=size)
        held = self.slots < n
        mean = torch.where(held, self.losses, 0.0).sum() / n.clamp(min=1)
        var = torch.where(held, (self.losses - mean) ** 2, 0.0).sum() / (n - 1).clamp(min=1)
        finite = (n_bad_all == 0) & torch.isfinite(loss)
        spike = finite & (n >= max(2, size // 2)) & (loss - mean > self.cfg.sigma * var.sqrt())
        keep = finite & ~spike
        at = self.slots == torch.remainder(self.count, size)
        self.losses = torch.where(at & keep, loss, self.losses)
        self.count = self.count + keep.to(torch.float64)
        return spike.to(torch.float64)

    # --- host side: after the step's one host read -----------------------------------------------------------
    def handle(self, step: int, spiked: bool, loss: float, finite: bool = True) -> bool:
        """Count and name a spike at `step` (identical on every rank); True when the loop must roll back. Under
        `rollback`, a step whose loss was non-finite on some rank rolls back too: its update was withheld, but the
        weights that gave it are the ones to leave (they give the next step's non-finite loss as well)."""
        self.step = step
        if not finite and self.cfg.action == "rollback":
            self.cause = "non-finite loss"
            log.warning(
                f"[spikes] rank {self.rank}: non-finite loss at step {step}: update not applied, action rollback"
            )
            return True
        if not spiked:
            self.consecutive = 0
            return False
        self.spikes += 1
        self.consecutive += 1
        self.cause = "loss spike"
        action = self.cfg.action
        log.warning(
            f"[spikes] rank {self.rank}: loss spike at step {step} (loss {loss:.4f} > window mean + "
            f"{self.cfg.sigma:g} sigma): update not applied, action {action}"
        )
        if action == "stop":
            raise LossSpikeStop(f"loss spike at step {step} (loss {loss:.4f}; spikes.action stop)")
        if self.consecutive >= self.cfg.max_consecutive:
            raise LossSpikeStop(
                f"{self.consecutive} loss spikes in a row at step {step} (spikes.max_consecutive): the loss has "
                "moved, not spiked"
            )
        if action == "skip":
            self.skipped += 1
        return action == "rollback"

    def rollback(self, checkpoints: Any, loader: Any) -> dict[str, Any] | None:
        """Reload the last complete checkpoint (every rank the one rank 0 names; `checkpoints`: the run's
        CheckpointManager) and keep the loader where it is: the data since the checkpoint is skipped, and the
        record goes into the next checkpoints. Returns the checkpoint's client state, or None when there is none
        yet (the spike was skipped)."""
        tag = [checkpoints.last_complete()]
        if tag[0] is None:
            log.warning(
                f"[spikes] step {self.step}: no complete checkpoint to roll back to; the step was skipped"
            )
            self.skipped += 1
            return None
        self._within_rollback_budget(tag[0])
        state = checkpoints.reload(tag[0])  # the schedule as configured (and its clock) is kept
        window = state.get("spikes") or {}
        if "losses" in window:  # the statistics as they were at the checkpoint
            self.losses = torch.tensor(window["losses"], dtype=torch.float64, device=self.losses.device)
            self.count.fill_(float(window["count"]))
        record = {
            "at_step": self.step,
            "to_step": int(state["step"]),
            "from_sample": int(state["loader"]["consumed_samples"]),
            "to_sample": int(loader.state_dict()["consumed_samples"]),
        }
        self.rollbacks.append(record)
        self.step, self.consecutive = record["to_step"], 0
        log.warning(
            f"[spikes] rank {dist.get_rank()}: rolled back from step {record['at_step']} to {tag[0]}; samples "
            f"{record['from_sample']}..{record['to_sample']} are skipped"
        )
        return state

    def _within_rollback_budget(self, tag: str) -> None:
        """Stop (LOSS_SPIKE) instead of a rollback to a checkpoint already rolled back to spikes.max_rollbacks
        times: without a newer checkpoint in between, the same trigger came back after each reload, and a
        step-counted run would reload it for ever. The records are the same on every rank, so is the decision."""
        match = TAG_RE.match(tag)
        to_step = int(match.group(1)) if match else -1
        done = sum(1 for r in self.rollbacks if r["to_step"] == to_step)
        if done >= self.cfg.max_rollbacks:
            raise LossSpikeStop(
                f"{self.cause} at step {self.step} after {done} rollbacks to {tag} (spikes.max_rollbacks): the "
                f"run does not get past it from that checkpoint; lower optim.lr or change the data, then resume "
                f"(the checkpoint is kept)"
            )

    def metrics(self) -> dict[str, int]:
        if not self.enabled:
            return {}
        return {"spikes": self.spikes, "spikes_skipped": self.skipped, "spike_rollbacks": len(self.rollbacks)}

    def state_dict(self) -> dict[str, Any]:
        """Window, counters and the rollbacks so far (a host read: checkpoint steps only)."""
        return {
            "losses": self.losses.tolist(),
            "count": int(self.count.item()),
            "spikes": self.spikes,
            "skipped": self.skipped,
            "consecutive": self.consecutive,
            "rollbacks": list(self.rollbacks),
        }

    def load_state_dict(self, state: dict[str, Any] | None, step: int) -> None:
        """A resumed run's detector; a checkpoint without one (older, or another window) starts it afresh."""
        self.step = step
        if not state or len(state.get("losses", ())) != self.slots.numel():
            return
        self.losses = torch.tensor(state["losses"], dtype=torch.float64, device=self.losses.device)
        self.count.fill_(float(state["count"]))
        self.spikes, self.skipped = int(state["spikes"]), int(state["skipped"])
        self.consecutive, self.rollbacks = int(state["consecutive"]), list(state["rollbacks"])
