"""Export parity: the trained engine's logits on a fixed probe batch are stored with each checkpoint, and the
export recomputes them with plain transformers. A conversion bug (a missed tied weight, a renamed key, a dtype
cast) shows up as a difference, not as a silently worse downstream model."""

from __future__ import annotations

import collections
import contextlib
import copy
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pretrain.checkpoint import safe_load
from pretrain.families import get_family

PROBE_TEXTS = (
    "The central bank raised interest rates for the third time this year.",
    "Shares in the company fell sharply after the announcement on Monday.",
)
PROBE_FILE = "parity_probe.pt"


def probe_inputs(tokenizer: Any, family: str) -> dict[str, torch.Tensor]:
    """The family's parity batch for PROBE_TEXTS (its spec adds e.g. T5's decoder inputs)."""
    return get_family(family).probe_inputs(tokenizer, list(PROBE_TEXTS))


@contextlib.contextmanager
def high_precision(module: torch.nn.Module) -> Iterator[None]:
    """Run FP8-converted linears (`model.float8`: torchao's Float8Linear and pretrain/run/float8.py's Float8Conv1D)
    as their plain layers (the same weights, no float8 casts) and compiled blocks eagerly for the duration: the function the
    exported high-precision model computes. A no-op for a module without them; torchao is not imported."""
    swapped = [
        x for x in module.modules() if type(x).__name__ == "Float8Linear" or hasattr(x, "plain_forward")
    ]
    if not swapped:
        yield
        return
    for lin in swapped:
        lin.forward = getattr(lin, "plain_forward", None) or types.MethodType(torch.nn.Linear.forward, lin)
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        for lin in swapped:
            del lin.forward


@torch.no_grad()
def probe_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device | str = "cpu"):
    """The probe batch's logits in high precision (an FP8 run's blocks without their float8 casts)."""
    was_training = model.training
    model.eval()
    with high_precision(model):
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


def check_parity(model: torch.nn.Module, probe_path: Path, reference: torch.nn.Module | None = None) -> float:
    """Max abs difference between the exported model's logits and the engine's stored ones (or, with
    `reference`, that module's on the same inputs: a merged export's weights were never in the engine)."""
    probe = safe_load.load(probe_path)
    ours = probe_logits(model, probe["inputs"])
    want = probe["logits"] if reference is None else probe_logits(reference, probe["inputs"])
    return float((ours - want).abs().max())
