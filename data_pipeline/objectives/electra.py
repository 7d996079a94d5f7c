"""ELECTRA replaced-token detection (Clark et al. 2020): the collator side of the `electra` objective.

A small MLM generator fills the masked positions of each block with tokens sampled from its softmax; the
discriminator (the `electra` family) labels every real token original or replaced. The spec, typed options and
config checks are pretrain/objectives/electra.py; the generator + discriminator module and the export of both
pretrain/objectives/rtd.py. This module imports no torch.

Masking follows the reference's defaults through the shared MLM keys: 15% of tokens (`objective.mlm_probability`),
85% of them `[MASK]` and 15% kept (`objective.mask_token_fraction: 0.85`, `random_token_fraction: 0`, set in
configs/base/electra.yaml).
"""

from __future__ import annotations

from typing import Any

from data_pipeline.objectives.builtin import masking_kwargs


def collator(cfg: Any, tokenizer: Any):
    """MLM inputs and labels plus `sample_u`, the uniform per position the generator's sample is drawn with, and
    `crop_u` where the sequence-contrastive loss is on (`objective.options.contrastive_weight`, typed in
    pretrain/objectives/electra.py)."""
    from data_pipeline.objectives.rtd_collator import ElectraCollator

    crop = float(cfg.objective.options.get("contrastive_weight", 0.0)) > 0
    return ElectraCollator(tokenizer, crop=crop, **masking_kwargs(cfg))
