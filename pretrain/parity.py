"""Export parity: the trained engine's logits on a fixed probe batch are stored with each checkpoint, and the
export recomputes them with plain transformers. A conversion bug (a missed tied weight, a renamed key, a dtype
cast) shows up as a difference, not as a silently worse downstream model."""

from __future__ import annotations

import collections
import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from core.io import atomic_write
from pretrain import safe_load
from pretrain.families import get_family

PROBE_TEXTS = [
    "The central bank raised interest rates for the third time this year.",
    "Shares in the company fell sharply after the announcement on Monday.",
]
PROBE_FILE = "parity_probe.pt"


def probe_inputs(tokenizer: Any, family: str) -> dict[str, torch.Tensor]:
    """The family's parity batch for PROBE_TEXTS (its spec adds e.g. T5's decoder inputs)."""
    return get_family(family).probe_inputs(tokenizer, PROBE_TEXTS)


@torch.no_grad()
def probe_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device | str = "cpu"):
    was_training = model.training
    model.eval()
    out = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
    if was_training:
        model.train()
    return out


class SnapshotProbe:
    """The probe's logits off the training step: the run's module is built once on the meta device (no memory), and
    each save's host snapshot of the module's weights is assigned to it, not copied, and run on the host in the
    save's background part. Same classes and same weights as the engine, so in fp32 its logits are the engine's;
    the step no longer pays a forward and its device-to-host read. The snapshot is let go after each probe.
    Buffers a state dict leaves out (rotary frequencies, position ids) are copied once from the live module."""

    def __init__(self, build: Callable[[], torch.nn.Module], live: torch.nn.Module) -> None:
        with torch.device("meta"):
            self.module = build()
        saved = set(self.module.state_dict())
        live_buffers = dict(live.named_buffers())
        missing = [n for n, _ in self.module.named_buffers() if n not in saved and n not in live_buffers]
        if missing:
            raise ValueError(
                f"the rebuilt module has buffers the trained one lacks: {', '.join(missing[:3])}"
            )
        self.buffers = {
            n: live_buffers[n].detach().to("cpu", copy=True)
            for n, _ in self.module.named_buffers()
            if n not in saved
        }

    def logits(self, weights: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The probe batch's logits under `weights` (a host snapshot of the module's state dict)."""
        # a copy of the snapshot's metadata: `assign=True` marks each entry of the metadata it is given, and the
        # snapshot is the checkpoint's (a resumed run's load would assign instead of copy)
        view = collections.OrderedDict(weights)
        view._metadata = copy.deepcopy(getattr(weights, "_metadata", {}))  # type: ignore[attr-defined]
        self.module.load_state_dict(view, strict=True, assign=True)
        for name, buf in self.buffers.items():
            owner, _, attr = name.rpartition(".")
            self.module.get_submodule(owner)._buffers[attr] = buf  # stays non-persistent
        try:
            return probe_logits(self.module, batch)
        finally:
            self.module.to("meta")  # the snapshot's tensors are the checkpoint's: not held past the save


def check_parity(model: torch.nn.Module, probe_path: Path) -> float:
    """Max abs difference between the exported model's logits and the engine's stored ones."""
    probe = safe_load.load(probe_path)
    ours = probe_logits(model, probe["inputs"])
    return float((ours - probe["logits"]).abs().max())


# --- engine parity (bench/loss_parity.py) ------------------------------------------------------------------------
# Two test-only switches read by the training path. Neither is a config key: no run YAML can turn them on, and
# with both unset the loop runs exactly as before (one None check per micro-batch).
RECORD_ENV = "LMSTACK_PARITY_RECORD"
SABOTAGE_ENV = "LMSTACK_PARITY_SABOTAGE"
# What each sabotage breaks on OUR side, so that the parity bench can prove it notices:
#   warmup     - the LR starts at its peak (warmup_steps forced to 0)
#   drop_micro - rank 0's first micro-batch of every step contributes no gradient (its loss is still logged)
#   sum_ranks  - the loss is summed over ranks instead of averaged (gradient and logged loss x world size)
#   no_clip    - gradient clipping is not applied (ds_config gradient_clipping 0)
SABOTAGES = ("warmup", "drop_micro", "sum_ranks", "no_clip")


def sabotage() -> str | None:
    """The sabotage named by LMSTACK_PARITY_SABOTAGE (test-only), or None; an unknown name is refused."""
    name = os.environ.get(SABOTAGE_ENV, "").strip()
    if not name:
        return None
    if name not in SABOTAGES:
        raise ValueError(f"{SABOTAGE_ENV}={name!r} is not one of {', '.join(SABOTAGES)}")
    return name


class BatchRecorder:
    """With LMSTACK_PARITY_RECORD=<folder>: what a reference loop needs to replay this run exactly. Rank 0
    writes the initial weights (init.pt) before DeepSpeed broadcasts them; every rank writes rank<r>.pt at the
    end with each micro-batch it trained on (the collator's output: masks, spans, labels as data), the CPU RNG
    state just before its forward (dropout and ELECTRA's generator samples replay from it), the plan and the
    per-step losses."""

    def __init__(self, rank: int) -> None:
        folder = os.environ.get(RECORD_ENV, "").strip()
        self.folder = Path(folder) if folder else None
        self.rank = rank
        self.micro: list[dict[str, Any]] = []
        self.losses: list[float] = []

    @property
    def active(self) -> bool:
        return self.folder is not None

    def initial(self, model: torch.nn.Module) -> None:
        if self.folder is None or self.rank != 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        atomic_write(self.folder / "init.pt", lambda f: torch.save(state, f))

    def batch(self, step: int, micro: int, host_batch: dict[str, torch.Tensor]) -> None:
        if self.folder is not None:
            self.micro.append(
                {
                    "step": step,
                    "micro": micro,
                    "rng": torch.get_rng_state(),
                    "batch": {k: v.clone() for k, v in host_batch.items()},
                }
            )

    def step(self, loss: float) -> None:
        if self.folder is not None:
            self.losses.append(float(loss))

    def close(self, plan: Any) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {
            "rank": self.rank,
            "micro": self.micro,
            "losses": self.losses,
            "plan": dict(plan.__dict__),
            "sabotage": sabotage(),
        }
        atomic_write(self.folder / f"rank{self.rank}.pt", lambda f: torch.save(data, f))
