"""ELECTRA (Clark et al. 2020): a BERT encoder trained as a replaced-token-detection discriminator.

The family is the discriminator (`ElectraForPreTraining`: post-LN BERT encoder, learned absolute positions, a
per-token binary head); the `electra` objective (data_pipeline/objectives/electra.py) builds the small MLM
generator beside it, sharing its embeddings, and exports both. The data spec is in core/specs.py.
"""

from __future__ import annotations

from typing import Any

from core.specs import ElectraModelOptions, ElectraOptions, generator_shape
from pretrain.families import shapes
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


def param_count(cfg: Any) -> tuple[int, int]:
    """The discriminator plus the generator built beside it; they share the whole embedding module."""
    m, v = cfg.model, shapes.padded_vocab(cfg)
    h, f = m.hidden_size, m.ffn_size
    e = ElectraModelOptions.model_validate(m.options).embedding_size or h
    emb = v * e + m.max_position_embeddings * e + 2 * e + 2 * e  # word, position, two segments, LayerNorm
    disc = (e * h + h if e != h else 0) + m.num_layers * shapes.bert_layer(h, f) + (h * h + h) + (h + 1)
    g = generator_shape(h, m.num_layers, ElectraOptions.model_validate(cfg.objective.options))
    gh, gf = g["hidden_size"], g["intermediate_size"]
    gen = (e * gh + gh if e != gh else 0) + g["num_hidden_layers"] * shapes.bert_layer(gh, gf)
    gen += gh * e + e + 2 * e + v + (0 if m.tie_word_embeddings else v * e)  # predictions dense + LN, lm bias
    return emb + disc + gen, v * e + v


SPEC = implement_family(
    "electra",
    lora_modules_to_save=("classifier",),
    build_config=build_config,
    param_count=param_count,
)
