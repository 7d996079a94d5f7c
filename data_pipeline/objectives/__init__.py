"""Pretraining objectives: batched, vectorised collators for RoBERTa MLM, GPT causal LM and T5 span corruption.

`build_collator(cfg, tokenizer)` is the one entry point the trainer uses (contract 4): it returns a callable that
turns the loader's list of per-sample dicts into exactly the keyword arguments the Hugging Face model's forward
takes, as int64 torch tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from data_pipeline.objectives import causal
from data_pipeline.objectives.causal import CausalCollator
from data_pipeline.objectives.mlm import MLMCollator
from data_pipeline.objectives.span_corruption import SpanCorruptionCollator

if TYPE_CHECKING:
    from runconfig.run import RunConfig

Collator = Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]

__all__ = ["CausalCollator", "Collator", "MLMCollator", "SpanCorruptionCollator", "build_collator", "prepare_model"]


def prepare_model(cfg: RunConfig, model: Any) -> None:
    """Model settings the objective relies on; the trainer calls it once on the model it trains.

    GPT document masking: transformers builds the per-document attention from the restarted position_ids only
    when no KV cache is created, so training must run with use_cache=False (set on the config here; the
    exporter may set it back to True for generation).
    """
    if cfg.objective.type == "causal" and cfg.objective.document_masking:
        causal.prepare_model(model)


def build_collator(cfg: RunConfig, tokenizer: Any) -> Collator:
    """The collator for `cfg.objective.type`, seeded with `cfg.run.seed`.

    mlm -> input_ids, attention_mask, labels (RobertaForMaskedLM); causal -> input_ids, attention_mask, labels,
    or with document masking input_ids, position_ids, labels (GPT2LMHeadModel); span_corruption -> input_ids
    (packing.seq_len), attention_mask, labels (targets length from t5_lengths) (T5ForConditionalGeneration).
    `line_by_line` packing pads each batch to its longest sample.
    """
    obj = cfg.objective
    if obj.type == "mlm":
        return MLMCollator(
            tokenizer,
            seed=cfg.run.seed,
            mlm_probability=obj.mlm_probability,
            mask_token_fraction=obj.mask_token_fraction,
            random_token_fraction=obj.random_token_fraction,
            whole_word_masking=obj.whole_word_masking,
            static_masking=obj.static_masking,
        )
    if obj.type == "causal":
        return CausalCollator(
            tokenizer, document_masking=obj.document_masking, packed=cfg.packing.mode != "line_by_line"
        )
    if obj.type == "span_corruption":
        return SpanCorruptionCollator(
            tokenizer,
            seed=cfg.run.seed,
            inputs_length=cfg.packing.seq_len,
            noise_density=obj.noise_density,
            mean_noise_span_length=obj.mean_noise_span_length,
        )
    raise ValueError(f"objective.type: unknown objective '{obj.type}'")
