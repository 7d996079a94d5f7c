"""ELECTRA (Clark et al. 2020): a BERT encoder trained as a replaced-token-detection discriminator.

The family is the discriminator (`ElectraForPreTraining`: post-LN BERT encoder, learned absolute positions, a
per-token binary head); the `electra` objective (data_pipeline/objectives/electra.py) builds the small MLM
generator beside it, sharing its embeddings, and exports both. The data spec is in core/specs.py.
"""

from __future__ import annotations

from typing import Any

from core.specs import ElectraModelOptions
from pretrain.families.registry import implement_family
from runconfig.model import ModelConfig


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
    from transformers import ElectraConfig

    o = ElectraModelOptions.model_validate(m.options)
    return ElectraConfig(
        vocab_size=vocab_size,
        embedding_size=o.embedding_size or m.hidden_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        intermediate_size=m.ffn_size,
        max_position_embeddings=m.max_position_embeddings,
        hidden_dropout_prob=m.dropout,
        attention_probs_dropout_prob=m.attention_dropout,
        layer_norm_eps=m.layer_norm_eps,
        initializer_range=m.initializer_range,
        type_vocab_size=2,  # BERT's segment table, as the released checkpoints have it
        tie_word_embeddings=m.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
    )


SPEC = implement_family("electra", build_config=build_config)
