"""Llama (Touvron et al. 2023; grouped-query attention as in Llama 2 70B and Llama 3, Ainslie et al. 2023): a
pre-norm decoder with RMSNorm, a SwiGLU feed-forward, rotary positions, no biases and no dropout besides the
attention's, trained as a causal LM. Built from transformers' LlamaForCausalLM, exported as such. Its data spec
(objectives, options, config checks) is `SPEC` below.

`model.ffn_size` is SwiGLU's inner width (Llama: ~8/3 x hidden, three matrices instead of two).
`model.options.num_kv_heads` sets grouped-query attention (default: one key/value head per query head).
Byte-level BPE with GPT-2's special tokens (`<|endoftext|>` as bos/eos/pad, EOS between packed documents), as
Llama 3's tiktoken BPE; Llama 1/2's SentencePiece `<s>`-prefixed inputs are not reproduced.

This module is the whole family: its typed `model.options`, config check, spec and config builder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from core.specs import FamilySpec, Options
from pretrain.families.registry import reject_t5_shape_keys, token_ids_for

if TYPE_CHECKING:
    from runconfig.model import ModelConfig


class LlamaOptions(Options):
    """`model.options` of llama."""

    num_kv_heads: int | None = Field(None, gt=0)  # key/value heads; None: as many as model.num_heads (no GQA)
    rope_theta: float = Field(10_000.0, gt=0)  # Llama 1/2: 10K; Llama 3: 500K


def validate(cfg: Any) -> None:
    m = cfg.model
    reject_t5_shape_keys(m, "llama", "a decoder")
    if m.dropout:
        raise ValueError(
            f"model.dropout ({m.dropout}): model.family 'llama' has no residual or embedding dropout "
            f"(set it to 0; model.attention_dropout applies)"
        )
    kv = LlamaOptions.model_validate(m.options).num_kv_heads
    if kv is not None and m.num_heads % kv:
        raise ValueError(f"model.options.num_kv_heads ({kv}) must divide model.num_heads ({m.num_heads})")


def build_config(m: ModelConfig, tokenizer: Any, vocab_size: int):
    from transformers import LlamaConfig

    o = LlamaOptions.model_validate(m.options)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.ffn_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=o.num_kv_heads or m.num_heads,
        hidden_act="silu",
        max_position_embeddings=m.max_position_embeddings,
        initializer_range=m.initializer_range,
        rms_norm_eps=m.layer_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": o.rope_theta},
        attention_dropout=m.attention_dropout,
        tie_word_embeddings=m.tie_word_embeddings,
        **token_ids_for(tokenizer, "pad_token_id", "bos_token_id", "eos_token_id"),
    )
    # transformers 5 saves the base only inside `rope_parameters`; 4.x reads the top-level `rope_theta` (and
    # would fall back to 10K without it), 5.x folds the key back into `rope_parameters` on load.
    config.rope_theta = o.rope_theta
    return config


SPEC = FamilySpec(
    name="llama",
    task="causal_lm",
    objectives=("causal",),
    tokenizer_types=("bpe",),
    reserved_positions=0,
    wraps_sequences=False,
    has_encoder=False,
    generative=True,
    validate=validate,
    options=LlamaOptions,
    model_class="LlamaForCausalLM",
    auto_class="AutoModelForCausalLM",
    # As GPT-2's budget recipe (same data, optimizer and schedule; the decoders differ in their blocks).
    finetune_defaults={"lr_grid": [3.0e-4, 1.0e-3], "warmup_ratio": 0.1, "weight_decay": 0.01},
    lora_modules_to_save=("score",),
    build_config=build_config,
)
