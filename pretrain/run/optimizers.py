"""The T5 paper's Adafactor, set up one way for pretraining (`optim.name: adafactor`, pretrain.run.engine) and for
fine-tuning (`finetune.optim: adafactor`, adapt.transfer, through the Trainer's `optimizer_cls_and_kwargs`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers.optimization import Adafactor

# transformers' Adafactor as Mesh TensorFlow trains and fine-tunes T5 (Raffel et al. 2020): each update scaled by
# its parameter's RMS (`scale_parameter`), factored second moments, no momentum; the LR is the caller's
# (`relative_step` off), so the caller's schedule drives it. The Trainer's own `optim="adafactor"` turns the
# parameter scaling off, which makes it another optimizer: with it T5's std-1 embeddings and its 0.016-RMS query
# matrices would take steps of the same absolute size.
PAPER_ADAFACTOR: dict[str, bool] = {"scale_parameter": True, "relative_step": False, "warmup_init": False}


def paper_adafactor(params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], lr: float) -> Adafactor:
    """The T5 paper's Adafactor (`PAPER_ADAFACTOR`) over `params` at `lr`."""
    return Adafactor(params, lr=lr, **PAPER_ADAFACTOR)
