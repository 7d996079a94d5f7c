"""Llama (Touvron et al. 2023; grouped-query attention as in Llama 2 70B and Llama 3, Ainslie et al. 2023): a
pre-norm decoder with RMSNorm, a SwiGLU feed-forward, rotary positions, no biases and no dropout besides the
attention's, trained as a causal LM. Built from transformers' LlamaForCausalLM, exported as such. Its data spec
(objectives, options, config checks) is the `llama` entry in core/specs.py.

`model.ffn_size` is SwiGLU's inner width (Llama: ~8/3 x hidden, three matrices instead of two).
`model.options.num_kv_heads` sets grouped-query attention (default: one key/value head per query head).
Byte-level BPE with GPT-2's special tokens (`<|endoftext|>` as bos/eos/pad, EOS between packed documents), as
Llama 3's tiktoken BPE; Llama 1/2's SentencePiece `<s>`-prefixed inputs are not reproduced.
"""

from __future__ import annotations

from typing import Any

from core.specs import LlamaOptions
from pretrain.families.registry import implement_family
from pretrain.families.roberta import special_ids
from runconfig.model import ModelConfig


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
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
        **special_ids(tokenizer),
    )
    # transformers 5 saves the base only inside `rope_parameters`; 4.x reads the top-level `rope_theta` (and
    # would fall back to 10K without it), 5.x folds the key back into `rope_parameters` on load.
    config.rope_theta = o.rope_theta
    return config


SPEC = implement_family(
    "llama",
    lora_modules_to_save=("score",),
    build_config=build_config,
)
