"""GPT-2 (Radford et al. 2019): pre-LN decoder, learned positions, tied LM head, causal LM. This module is the
whole family: its spec and its config builder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pretrain.families import shapes
from pretrain.families.registry import causal_decoder, token_ids_for

if TYPE_CHECKING:
    from runconfig.model import ModelConfig


def build_config(m: ModelConfig, tokenizer: Any, vocab_size: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=m.max_position_embeddings,
        n_embd=m.hidden_size,
        n_layer=m.num_layers,
        n_head=m.num_heads,
        n_inner=m.ffn_size,
        resid_pdrop=m.dropout,
        embd_pdrop=m.dropout,
        attn_pdrop=m.attention_dropout,
        layer_norm_epsilon=m.layer_norm_eps,
        initializer_range=m.initializer_range,
        tie_word_embeddings=m.tie_word_embeddings,
        # GPT-2's tanh GELU as one fused kernel; the default `gelu_new` composes it from ~8 elementwise kernels.
        activation_function="gelu_pytorch_tanh",
        **token_ids_for(tokenizer, "pad_token_id", "bos_token_id", "eos_token_id"),
    )


def float8_linears(m: ModelConfig) -> dict[str, tuple[int, int]]:
    """Each GPT2Block's projections (transformers' Conv1D, weights stored [in, out]) with their (in, out) widths."""
    h, f = m.hidden_size, m.ffn_size
    return {"attn.c_attn": (h, 3 * h), "attn.c_proj": (h, h), "mlp.c_fc": (h, f), "mlp.c_proj": (f, h)}


SPEC = causal_decoder(
    name="gpt2",
    model_class="GPT2LMHeadModel",
    build_config=build_config,
    mup_readout=("transformer.ln_f", "lm_head"),
    param_count=shapes.gpt2,
    float8_linears=float8_linears,
)
