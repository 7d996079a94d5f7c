"""Specs of the three classic objectives: RoBERTa dynamic MLM, GPT causal LM, T5 span corruption.

Factories import their collator lazily so that reading the specs (config validation) needs no torch.
"""

from __future__ import annotations

from typing import Any

from data_pipeline.objectives.registry import ObjectiveSpec, register_objective
from data_pipeline.objectives.t5_lengths import t5_lengths


def masking_kwargs(cfg: Any) -> dict[str, Any]:
    """The masking settings of the config, as every MLM-style collator (MLM, ELECTRA's generator input) takes them."""
    obj = cfg.objective
    return dict(seed=cfg.run.seed, mlm_probability=obj.mlm_probability, mask_token_fraction=obj.mask_token_fraction,
                random_token_fraction=obj.random_token_fraction, whole_word_masking=obj.whole_word_masking,
                static_masking=obj.static_masking)


def mlm_collator(cfg: Any, tokenizer: Any):
    """input_ids, attention_mask, labels (-100 where not predicted)."""
    from data_pipeline.objectives.mlm import MLMCollator

    return MLMCollator(tokenizer, **masking_kwargs(cfg))


def mlm_prepare(cfg: Any, model: Any) -> None:
    """Sparse prediction (objective.sparse_prediction) where the family names its MLM head."""
    if not cfg.objective.sparse_prediction:
        return
    from pretrain.families import get_family

    head = get_family(cfg.model.family).mlm_head
    if head is not None:
        from data_pipeline.objectives.sparse_mlm import enable_sparse_prediction

        enable_sparse_prediction(model, head)


def causal_collator(cfg: Any, tokenizer: Any):
    """input_ids, attention_mask, labels; with document masking input_ids, position_ids, labels."""
    from data_pipeline.objectives.causal import CausalCollator

    return CausalCollator(
        tokenizer, document_masking=cfg.objective.document_masking, packed=cfg.packing.mode != "line_by_line"
    )


def causal_prepare(cfg: Any, model: Any) -> None:
    """Document masking: transformers builds the per-document attention from the restarted position_ids only
    when no KV cache is created, so training runs with use_cache=False."""
    if cfg.objective.document_masking:
        from data_pipeline.objectives import causal

        causal.prepare_model(model)


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


MLM = register_objective(ObjectiveSpec("mlm", ("full_sentences", "line_by_line"), mlm_collator,
                                       prepare_model=mlm_prepare))
CAUSAL = register_objective(ObjectiveSpec("causal", ("contiguous", "line_by_line"), causal_collator, wrap_bos=False,
                                          prepare_model=causal_prepare))  # fmt: skip
SPAN_CORRUPTION = register_objective(ObjectiveSpec("span_corruption", ("t5_spans",), span_collator,
                                                   block_length=span_block_length, wrap_bos=False))  # fmt: skip
