"""The collator side of the three classic objectives: RoBERTa dynamic MLM, GPT causal LM, T5 span corruption (each
objective's spec, which names these factories, is its module in pretrain/objectives/).

Factories import their collator lazily so that importing this module (packing) needs no torch.
"""

from __future__ import annotations

from typing import Any

from data_pipeline.objectives.t5_lengths import t5_lengths


def masking_kwargs(cfg: Any) -> dict[str, Any]:
    """The masking settings of the config, as every MLM-style collator (MLM, ELECTRA's generator input) takes them."""
    obj = cfg.objective
    return dict(
        seed=cfg.run.seed,
        mlm_probability=obj.mlm_probability,
        mask_token_fraction=obj.mask_token_fraction,
        random_token_fraction=obj.random_token_fraction,
        whole_word_masking=obj.whole_word_masking,
    )


def mlm_collator(cfg: Any, tokenizer: Any):
    """input_ids, attention_mask, labels (-100 where not predicted)."""
    from data_pipeline.objectives.mlm import MLMCollator

    return MLMCollator(tokenizer, **masking_kwargs(cfg))


def causal_collator(cfg: Any, tokenizer: Any):
    """input_ids, attention_mask, labels; with document masking input_ids, position_ids, labels."""
    from data_pipeline.objectives.causal import CausalCollator

    return CausalCollator(
        tokenizer, document_masking=cfg.objective.document_masking, packed=cfg.packing.mode != "line_by_line"
    )


def span_collator(cfg: Any, tokenizer: Any):
    """input_ids (packing.seq_len), attention_mask, labels (the targets length from t5_lengths)."""
    from data_pipeline.objectives.span_corruption import SpanCorruptionCollator

    obj = cfg.objective
    return SpanCorruptionCollator(
        tokenizer,
        seed=cfg.run.seed,
        inputs_length=cfg.packing.seq_len,
        noise_density=obj.noise_density,
        mean_noise_span_length=obj.mean_noise_span_length,
    )


def span_block_length(seq_len: int, obj: Any) -> int:
    return t5_lengths(seq_len, obj.noise_density, obj.mean_noise_span_length)[0]
