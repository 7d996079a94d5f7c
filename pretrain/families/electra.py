"""ELECTRA (Clark et al. 2020): a BERT encoder trained as a replaced-token-detection discriminator.

The family is the discriminator (`ElectraForPreTraining`: post-LN BERT encoder, learned absolute positions, a
per-token binary head); the `electra` objective (data_pipeline/objectives/electra.py) builds the small MLM
generator beside it, sharing its embeddings, and exports both.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pretrain.families.registry import FamilySpec, register_family
from runconfig.base import Section
from runconfig.model import ModelConfig


class ElectraModelOptions(Section):
    """`model.options` for this family."""

    # Factorised embeddings (ELECTRA-small: 128 under a 256-wide encoder; base and large: = hidden size): the
    # embedding table, shared with the generator, is projected to each network's width. None: model.hidden_size.
    embedding_size: int | None = Field(None, gt=0)


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
    options=ElectraModelOptions,
    # The reference's masking: 85% [MASK], 15% kept, no random tokens (the generator supplies the replacements).
    objective_defaults={"mask_token_fraction": 0.85, "random_token_fraction": 0.0},
    # Clark et al. 2020, Table 7: ELECTRA-Small fine-tunes at 3e-4 (Base 1e-4), warmup 10% of the steps, no
    # weight decay. 1e-3 (the grid the other budget families use) is above anything the paper uses for any size.
    finetune_defaults={"lr_grid": [1.0e-4, 3.0e-4], "warmup_ratio": 0.1, "weight_decay": 0.0},
))
