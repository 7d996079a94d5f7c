"""Loss spikes, handled alike on every rank (config `spikes`, docs/recovery.md).

The detector judges the step loss that StepSync has already all-reduced, on the device, before the optimizer step:
every rank computes the same flag from the same figures, so no rank can decide alone (the failure reported for
spike checks taken on rank 0 only), and the check costs no collective and no host read. The flag joins StepGuard's
non-finite flag, so a spiking step's update is never applied; the loop learns of it in the step's one host read
(StepSync.read) and then, by `spikes.action`, goes on (skip), reloads the last complete checkpoint and leaves the
data since it behind (rollback: an action the loop carries out, pretrain/run/callback_runner.py), or stops with exit
code LOSS_SPIKE (stop). The callback that runs it is pretrain/callbacks/spikes.py.

The rule is OLMo-core's skip-step rule (optim/skip_step_optimizer.py): a spike is a finite loss above the mean
plus `sigma` standard deviations of the last `window` losses, judged once half the window is filled. Unlike it,
spiking and non-finite losses stay out of the window, so one spike does not widen the band that hides the next;
`max_consecutive` spikes in a row stop the run instead (the loss has moved for good).
"""

from __future__ import annotations

from typing import Any

import torch

from core.errors import CannotContinueError
from core.exit_codes import LOSS_SPIKE
from core.log import get_logger

log = get_logger(__name__)


class LossSpikeStop(CannotContinueError):
    """The run stopped on a loss spike (spikes.action stop, or spikes.max_consecutive in a row)."""

    exit_code = LOSS_SPIKE


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
        self.step = 0  # the last step handled (host)
        self.spikes = self.skipped = self.consecutive = 0
        self.rollbacks: list[dict[str, int]] = []
        self.cause = "loss spike"  # what the last rollback was for (a spike, or a non-finite loss)

    # --- device side: no host read ---------------------------------------------------------------------------
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

    def restore_window(self, state: dict[str, Any] | None) -> None:
        """After a rollback: the window statistics as they were at the checkpoint (its saved state)."""
        if state and len(state.get("losses", ())) == self.slots.numel():
            self.losses = torch.tensor(state["losses"], dtype=torch.float64, device=self.losses.device)
            self.count.fill_(float(state["count"]))

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
