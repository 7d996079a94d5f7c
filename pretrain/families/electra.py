"""ELECTRA (Clark et al. 2020): a BERT encoder trained as a replaced-token-detection discriminator.

The family is the discriminator (`ElectraForPreTraining`: post-LN BERT encoder, learned absolute positions, a
per-token binary head); the `electra` objective (pretrain/objectives/electra.py) builds the small MLM
generator beside it, sharing its embeddings, and exports both. This module is the whole family: its typed
`model.options`, spec and builders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from core.specs import FamilySpec, Options
from pretrain.families import shapes
from pretrain.families.registry import bert_config_keys, token_ids_for

if TYPE_CHECKING:
    from runconfig.model import ModelConfig


class ElectraModelOptions(Options):
    """`model.options` of the electra family."""

    # Factorised embeddings (ELECTRA-small: 128 under a 256-wide encoder; base and large: = hidden size): the
    # embedding table, shared with the generator, is projected to each network's width. None: model.hidden_size.
    embedding_size: int | None = Field(None, gt=0)


def build_config(m: ModelConfig, tokenizer: Any, vocab_size: int):
    from transformers import ElectraConfig

    o = ElectraModelOptions.model_validate(m.options)
    return ElectraConfig(
        vocab_size=vocab_size,
        embedding_size=o.embedding_size or m.hidden_size,
        **bert_config_keys(m),
        type_vocab_size=2,  # BERT's segment table, as the released checkpoints have it
        **token_ids_for(tokenizer, "pad_token_id"),
    )


def param_count(cfg: Any) -> tuple[int, int]:
    """The discriminator plus the generator built beside it; they share the whole embedding module."""
    m, v = cfg.model, shapes.padded_vocab(cfg)
    h, f = m.hidden_size, m.ffn_size
    e = ElectraModelOptions.model_validate(m.options).embedding_size or h
    emb = v * e + m.max_position_embeddings * e + 2 * e + 2 * e  # word, position, two segments, LayerNorm
    disc = (e * h + h if e != h else 0) + m.num_layers * shapes.bert_layer(h, f) + (h * h + h) + (h + 1)
    g = shapes.generator_shape(h, m.num_layers, cfg.objective.spec.parse_options(cfg.objective.options))
    gh, gf = g["hidden_size"], g["intermediate_size"]
    gen = (e * gh + gh if e != gh else 0) + g["num_hidden_layers"] * shapes.bert_layer(gh, gf)
    gen += gh * e + e + 2 * e + v + (0 if m.tie_word_embeddings else v * e)  # predictions dense + LN, lm bias
    return emb + disc + gen, v * e + v


SPEC = FamilySpec(
    name="electra",
    task="token_detection",
    objectives=("electra",),
    tokenizer_types=("wordpiece", "bpe"),
    reserved_positions=0,
    options=ElectraModelOptions,
    # The reference's masking: 85% [MASK], 15% kept, no random tokens (the generator supplies them).
    objective_defaults={"mask_token_fraction": 0.85, "random_token_fraction": 0.0},
    model_class="ElectraForPreTraining",
    auto_class="AutoModelForPreTraining",
    rtd="pretrain.objectives.rtd:ELECTRA",
    export_heads=("AutoModelForSequenceClassification", "AutoModelForTokenClassification"),
    # Clark et al. 2020, Table 7: ELECTRA-Small fine-tunes at 3e-4 (Base 1e-4), warmup 10% of the steps, no weight
    # decay; 1e-3 is above anything the paper uses for any size.
    finetune_defaults={"lr_grid": [1.0e-4, 3.0e-4], "warmup_ratio": 0.1, "weight_decay": 0.0},
    lora_modules_to_save=("classifier",),
    build_config=build_config,
    param_count=param_count,
)
