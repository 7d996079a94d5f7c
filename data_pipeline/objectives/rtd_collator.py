"""ELECTRA's collator: RoBERTa-style dynamic masking plus the uniform each masked position's generator sample is
drawn with (pretrain/objectives/rtd.py reads it), from the counter-based stream of (seed, epoch, sample_id,
position), so a resumed, re-sharded or re-batched run reproduces every sample bit for bit. With the sequence-contrastive
loss on, also `crop_u`, one uniform per sequence from its own stream: where its cropped view starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from data_pipeline.objectives._batch import sample_meta
from data_pipeline.objectives._rng import row_uniform, sample_keys, stream_bits
from data_pipeline.objectives.mlm import MLMCollator

STREAM_RTD = 21  # the generator-sampling stream (MLM masking uses 1, span corruption 11)
STREAM_RTD_CROP = 22  # the start of each sequence's cropped view (the sequence-contrastive loss)
_U24 = float(1 << 24)


class ElectraCollator(MLMCollator):
    """RoBERTa-style dynamic masking (input_ids with [MASK], labels = original ids at the selected positions)
    plus `sample_u`: float32 [batch, length] in [0, 1), the uniform each masked position is sampled with, and with
    `crop` `crop_u`: float32 [batch] in [0, 1), where each sequence's cropped view starts."""

    def __init__(self, tokenizer: Any, *, crop: bool = False, **masking: Any) -> None:
        super().__init__(tokenizer, **masking)
        self.crop = crop

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = super().__call__(samples)
        epoch, sample_id = sample_meta(samples)
        if self.static:  # one draw per sequence for the whole run, like its mask
            epoch = np.zeros_like(epoch)
        bits = stream_bits(sample_keys(self.seed, epoch, sample_id, STREAM_RTD), batch["input_ids"].shape[1])
        # 24 bits: exact, strictly < 1
        u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / _U24)
        batch["sample_u"] = torch.from_numpy(u)
        if self.crop:
            crop = row_uniform(sample_keys(self.seed, epoch, sample_id, STREAM_RTD_CROP))
            batch["crop_u"] = torch.from_numpy(crop.astype(np.float32).clip(max=np.float32(1 - 1 / _U24)))
        return batch
