"""GPT-2 (Radford et al. 2019): pre-LN decoder, learned positions, tied LM head, causal LM."""

from __future__ import annotations

from typing import Any

from pretrain.families.registry import FamilySpec, register_family
from pretrain.families.roberta import special_ids
from runconfig.model import ModelConfig


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
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
        **special_ids(tokenizer),
    )


SPEC = register_family(FamilySpec(
    name="gpt2",
    build_config=build_config,
    model_class="GPT2LMHeadModel",
    task="causal_lm",
    objectives=("causal",),
    tokenizer_types=("bpe",),
    auto_class="AutoModelForCausalLM",
    reserved_positions=0,
    wraps_sequences=False,
    has_encoder=False,
    generative=True,
    # The grid, warmup and decay the budget preset's +26-point BBC margin was measured with (bench/transfer.py);
    # transformers' run_glue defaults otherwise (no published GPT-2 classification recipe).
    finetune_defaults={"lr_grid": [3.0e-4, 1.0e-3], "warmup_ratio": 0.1, "weight_decay": 0.01},
))
