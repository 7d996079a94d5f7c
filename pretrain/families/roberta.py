"""RoBERTa (Liu et al. 2019): post-LN BERT encoder, learned positions offset by padding_idx + 1, MLM head.
Its data spec (objectives, tokenizers, positions) is in core/specs.py."""

from __future__ import annotations

from typing import Any

from pretrain.families import shapes
from pretrain.families.registry import implement_family
from runconfig.model import ModelConfig


def special_ids(tokenizer: Any) -> dict[str, Any]:
    return {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id}  # fmt: skip


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
    from transformers import RobertaConfig

    return RobertaConfig(
        vocab_size=vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        intermediate_size=m.ffn_size,
        max_position_embeddings=m.max_position_embeddings,
        hidden_dropout_prob=m.dropout,
        attention_probs_dropout_prob=m.attention_dropout,
        layer_norm_eps=m.layer_norm_eps,
        initializer_range=m.initializer_range,
        type_vocab_size=1,
        tie_word_embeddings=m.tie_word_embeddings,
        **special_ids(tokenizer),
    )


SPEC = implement_family(
    "roberta",
    lora_modules_to_save=("classifier",),
    build_config=build_config,
    param_count=shapes.roberta,
)
