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

from core.specs import Options
from pretrain.families.registry import causal_decoder, hf_shape_keys, reject_t5_shape_keys, token_ids_for

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


def float8_linears(m: ModelConfig) -> dict[str, tuple[int, int]]:
    """Each decoder layer's linears as transformers' LlamaDecoderLayer names them, with their (in, out) widths."""
    h, f = m.hidden_size, m.ffn_size
    kv = (LlamaOptions.model_validate(m.options).num_kv_heads or m.num_heads) * (h // m.num_heads)
    attn = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h)}
    mlp = {"gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
    return {f"self_attn.{k}": v for k, v in attn.items()} | {f"mlp.{k}": v for k, v in mlp.items()}


def build_config(m: ModelConfig, tokenizer: Any, vocab_size: int):
    from transformers import LlamaConfig

    o = LlamaOptions.model_validate(m.options)
    config = LlamaConfig(
        vocab_size=vocab_size,
        **hf_shape_keys(m),
        num_key_value_heads=o.num_kv_heads or m.num_heads,
        hidden_act="silu",
        rms_norm_eps=m.layer_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": o.rope_theta},
        attention_dropout=m.attention_dropout,
        **token_ids_for(tokenizer, "pad_token_id", "bos_token_id", "eos_token_id"),
    )
    # transformers 5 saves the base only inside `rope_parameters`; 4.x reads the top-level `rope_theta` (and
    # would fall back to 10K without it), 5.x folds the key back into `rope_parameters` on load.
    config.rope_theta = o.rope_theta
    return config


SPEC = causal_decoder(
    name="llama",
    validate=validate,
    options=LlamaOptions,
    model_class="LlamaForCausalLM",
    build_config=build_config,
    mup_readout=("model.norm", "lm_head"),
    float8_linears=float8_linears,
)
