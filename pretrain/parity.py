"""Export parity: the trained engine's logits on a fixed probe batch are stored with each checkpoint, and the
export recomputes them with plain transformers. A conversion bug (a missed tied weight, a renamed key, a dtype
cast) shows up as a difference, not as a silently worse downstream model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from core.io import atomic_write
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


def save_probe(path: Path, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
    atomic_write(path, lambda f: torch.save({"inputs": batch, "logits": logits}, f))


def check_parity(model: torch.nn.Module, probe_path: Path) -> float:
    """Max abs difference between the exported model's logits and the engine's stored ones."""
    probe = torch.load(probe_path, weights_only=False)
    ours = probe_logits(model, probe["inputs"])
    return float((ours - probe["logits"]).abs().max())
