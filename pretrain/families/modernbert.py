"""ModernBERT (Warner et al. 2024): a pre-LN encoder with GLU feed-forward, rotary positions, alternating global
and sliding-window (local) attention, no biases, and sparse prediction (the vocabulary projection runs only on
the masked positions), trained with 30% masking and no dropout. Built from transformers' ModernBertForMaskedLM.

`model.ffn_size` is the GLU's inner width (ModernBERT-base: 1152; the input projection is twice that).
Departure: the reference trains unpadded (FlashAttention varlen); transformers' CPU/SDPA path takes padded
batches, and our FULL-SENTENCES packing leaves <= 1% padding, so nothing is unpadded here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pretrain.families.registry import FamilySpec, register_family
from runconfig.base import Section
from runconfig.model import ModelConfig


class ModernBertOptions(Section):
    """`model.options` for this family; defaults are ModernBERT-base's published config."""

    local_attention: int = Field(128, gt=0)  # total window of the sliding-window layers
    global_attn_every_n_layers: int = Field(3, ge=1)  # layer i is global when i % n == 0
    global_rope_theta: float = Field(160_000.0, gt=0)
    local_rope_theta: float = Field(10_000.0, gt=0)
    sparse_prediction: bool = True
    hidden_activation: str = "gelu"
    initializer_cutoff_factor: float = Field(2.0, gt=0)
    classifier_pooling: Literal["cls", "mean"] = "mean"


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
    from transformers import ModernBertConfig

    o = ModernBertOptions.model_validate(m.options)
    cls = getattr(tokenizer, "cls_token_id", None)
    sep = getattr(tokenizer, "sep_token_id", None)
    return ModernBertConfig(
        vocab_size=vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.ffn_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        max_position_embeddings=m.max_position_embeddings,
        hidden_activation=o.hidden_activation,
        initializer_range=m.initializer_range,
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
        tie_word_embeddings=m.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id if cls is None else cls,
        eos_token_id=tokenizer.eos_token_id if sep is None else sep,
        cls_token_id=tokenizer.bos_token_id if cls is None else cls,
        sep_token_id=tokenizer.eos_token_id if sep is None else sep,
    )


def validate(cfg: Any) -> None:
    m = cfg.model
    for key in ("d_kv", "num_decoder_layers"):
        if getattr(m, key) is not None:
            raise ValueError(f"model.{key}: not used by model.family 'modernbert' (an encoder; head size is "
                             f"hidden_size / num_heads)")


def flops_per_token(spec: FamilySpec, m: ModelConfig, n_params: int, seq_len: int) -> float:
    """6N plus attention, where a sliding-window layer attends to at most `local_attention` + 1 keys. The MLM
    head is counted on every position (an upper bound: sparse prediction runs it on the masked ones only)."""
    o = ModernBertOptions.model_validate(m.options)
    n_global = len(range(0, m.num_layers, o.global_attn_every_n_layers))
    keys = n_global * seq_len + (m.num_layers - n_global) * min(seq_len, o.local_attention + 1)
    return 6.0 * n_params + 12.0 * m.hidden_size * keys


SPEC = register_family(FamilySpec(
    name="modernbert",
    build_config=build_config,
    model_class="ModernBertForMaskedLM",
    task="masked_lm",
    objectives=("mlm",),
    tokenizer_types=("bpe", "wordpiece"),
    auto_class="AutoModelForMaskedLM",
    reserved_positions=0,  # rotary: every position up to max_position_embeddings
    flops_per_token=flops_per_token,
    validate=validate,
    options=ModernBertOptions,
    objective_defaults={"mlm_probability": 0.3},
    export_config={"sparse_prediction": False},
    # Warner et al. 2024 sweep LR per task for base/large; the budget presets' 4 x 128 encoder fine-tunes at
    # 3e-4..1e-3 (random init 0.78 on BBC, bench/transfer.py), warmup 10%, weight decay 0.01 as measured.
    finetune_defaults={"lr_grid": [3.0e-4, 1.0e-3], "warmup_ratio": 0.1, "weight_decay": 0.01},
))
