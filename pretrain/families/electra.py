"""ELECTRA (Clark et al. 2020): a BERT encoder trained as a replaced-token-detection discriminator.

The family is the discriminator (`ElectraForPreTraining`: post-LN BERT encoder, learned absolute positions, a
per-token binary head); the `electra` objective (data_pipeline/objectives/electra.py) builds the small MLM
generator beside it, sharing its embeddings, and exports both.
"""

from __future__ import annotations

from typing import Any

from pretrain.families.registry import FamilySpec, register_family
from runconfig.model import ModelConfig


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
    from transformers import ElectraConfig

    return ElectraConfig(
        vocab_size=vocab_size,
        embedding_size=m.hidden_size,
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


SPEC = register_family(FamilySpec(
    name="electra",
    build_config=build_config,
    model_class="ElectraForPreTraining",
    task="token_detection",
    objectives=("electra",),
    tokenizer_types=("wordpiece", "bpe"),
    auto_class="AutoModelForPreTraining",
    export_heads=("AutoModelForSequenceClassification", "AutoModelForTokenClassification"),
    reserved_positions=0,
))
