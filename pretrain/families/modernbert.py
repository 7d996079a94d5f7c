"""ModernBERT (Warner et al. 2024): a pre-LN encoder with GLU feed-forward, rotary positions, alternating global
and sliding-window (local) attention, no biases, and sparse prediction (the vocabulary projection runs only on
the masked positions), trained with 30% masking and no dropout. Built from transformers' ModernBertForMaskedLM.

`model.ffn_size` is the GLU's inner width (ModernBERT-base: 1152; the input projection is twice that).
Departure: the reference trains unpadded (FlashAttention varlen); transformers' CPU/SDPA path takes padded
batches, and our FULL-SENTENCES packing leaves <= 1% padding, so nothing is unpadded here.

This module is the whole family: its typed `model.options`, config check, spec and builders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from core.specs import FamilySpec, Options
from pretrain.families import shapes
from pretrain.families.registry import hf_shape_keys, masked_encoder, reject_t5_shape_keys, token_ids_for

if TYPE_CHECKING:
    from runconfig.model import ModelConfig


class ModernBertOptions(Options):
    """`model.options` of modernbert; defaults are ModernBERT-base's published config."""

    local_attention: int = Field(128, gt=0)  # total window of the sliding-window layers
    global_attn_every_n_layers: int = Field(3, ge=1)  # layer i is global when i % n == 0
    global_rope_theta: float = Field(160_000.0, gt=0)  # RoPE base of the global-attention layers
    local_rope_theta: float = Field(10_000.0, gt=0)  # RoPE base of the sliding-window layers
    sparse_prediction: bool = True  # training scores only the masked positions (the export: every position)
    hidden_activation: str = "gelu"  # the gated MLP's activation (GeGLU)
    initializer_cutoff_factor: float = Field(2.0, gt=0)  # init: truncated normal cut at this many std devs
    classifier_pooling: Literal["cls", "mean"] = "mean"  # a classification head reads [CLS] or the mean


def validate(cfg: Any) -> None:
    reject_t5_shape_keys(cfg.model, "modernbert", "an encoder")


def build_config(m: ModelConfig, tokenizer: Any, vocab_size: int):
    from transformers import ModernBertConfig

    o = ModernBertOptions.model_validate(m.options)
    ids = token_ids_for(tokenizer, "pad_token_id", "cls_token_id", "sep_token_id")
    return ModernBertConfig(
        vocab_size=vocab_size,
        **hf_shape_keys(m),
        hidden_activation=o.hidden_activation,
        initializer_cutoff_factor=o.initializer_cutoff_factor,
        norm_eps=m.layer_norm_eps,
        embedding_dropout=m.dropout,
        mlp_dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        local_attention=o.local_attention,
        global_attn_every_n_layers=o.global_attn_every_n_layers,
        global_rope_theta=o.global_rope_theta,
        local_rope_theta=o.local_rope_theta,
        sparse_prediction=o.sparse_prediction,
        classifier_pooling=o.classifier_pooling,
        bos_token_id=ids["cls_token_id"],  # an encoder's inputs open with [CLS] and close with [SEP]
        eos_token_id=ids["sep_token_id"],
        **ids,
    )


def flops_per_token(spec: FamilySpec, m: ModelConfig, n_params: int, seq_len: int) -> float:
    """6N plus attention, where a sliding-window layer attends to at most `local_attention` + 1 keys. The MLM
    head is counted on every position (an upper bound: sparse prediction runs it on the masked ones only)."""
    o = ModernBertOptions.model_validate(m.options)
    n_global = len(range(0, m.num_layers, o.global_attn_every_n_layers))
    keys = n_global * seq_len + (m.num_layers - n_global) * min(seq_len, o.local_attention + 1)
    return 6.0 * n_params + 12.0 * m.hidden_size * keys


SPEC = masked_encoder(
    name="modernbert",
    reserved_positions=0,
    validate=validate,
    options=ModernBertOptions,
    objective_defaults={"mlm_probability": 0.3},
    model_class="ModernBertForMaskedLM",
    export_config={"sparse_prediction": False},
    min_transformers="4.48",  # transformers added `modernbert` in 4.48
    # Replaced-token detection (objective.type: electra) on this body (issue 46): the discriminator is exported as
    # ModernBertModel, the generator is a narrower ModernBERT sharing its embeddings.
    rtd="pretrain.objectives.rtd:MODERNBERT",
    lora_target_modules=("Wqkv", "Wo"),  # fused attention in, attention and MLP out
    # Warner et al. 2024 sweep the LR per task for base/large; the budget presets' 4 x 128 encoder fine-tunes at
    # 3e-4..1e-3 (random init 0.78 on BBC, bench/transfer.py), warmup 10%, decay 0.01.
    finetune_defaults={"lr_grid": [3.0e-4, 1.0e-3], "warmup_ratio": 0.1, "weight_decay": 0.01},
    lora_modules_to_save=("head", "classifier"),
    build_config=build_config,
    flops_per_token=flops_per_token,
    param_count=shapes.modernbert,
)
