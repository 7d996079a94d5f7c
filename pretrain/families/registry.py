"""Model families as specs (torchtitan's `ModelSpec`): everything the pipeline needs to know about a family in one
object, found by name in `core.registry.FAMILIES`. Each family is one module here that gives its whole spec as
`SPEC` (data, typed options, checks and builders) and one `lmstack.families` entry point in pyproject.toml naming
it, as an outside package's family is; config validation reads the spec's data, so the module imports no torch.

HF classes are named as strings ('RobertaForMaskedLM' from transformers, or 'package.module:Class') and imported
inside the config builder, so reading a spec needs no torch.
"""

from __future__ import annotations

from typing import Any

from core.errors import PluginError
from core.registry import FAMILIES
from core.specs import FamilySpec, attention_layers, default_flops_per_token, default_probe_inputs

__all__ = [
    "FAMILIES",
    "FamilySpec",
    "attention_layers",
    "bert_config_keys",
    "causal_decoder",
    "masked_encoder",
    "default_flops_per_token",
    "default_probe_inputs",
    "family_names",
    "get_family",
    "hf_shape_keys",
    "register_family",
    "reject_t5_shape_keys",
    "special_token_ids",
    "token_ids_for",
]


# A whole spec, data and implementation (an outside package's, or a test's), and the names known: the registry's own
# methods under the names the families' callers read.
register_family = FAMILIES.add
family_names = FAMILIES.names


def get_family(name: str) -> FamilySpec:
    """The complete spec: one without a config builder is an error naming the family, not a `None` call deep in
    model building."""
    spec = FAMILIES.get(name)
    if spec.build_config is None:
        raise PluginError(
            f"model.family '{name}': its FamilySpec gives no build_config, so no model can be built"
        )
    return spec


def reject_t5_shape_keys(m: Any, family: str, kind: str) -> None:
    """`d_kv` and `num_decoder_layers` shape only T5: set for another family, they would be silently ignored."""
    for key in ("d_kv", "num_decoder_layers"):
        if getattr(m, key) is not None:
            raise ValueError(
                f"model.{key}: not used by model.family '{family}' ({kind}; head size is "
                f"hidden_size / num_heads)"
            )


def special_token_ids(tokenizer: Any) -> dict[str, int | None]:
    """The special-token ids a family's HF config takes, read from the run's tokenizer by one rule for every
    family: pad, bos and eos as the tokenizer names them; cls and sep as [CLS] and [SEP] where it has them
    (WordPiece), else its bos and eos (`<s>`, `</s>`; GPT-2's `<|endoftext|>`). Each builder takes the keys its
    config has from this dict instead of deriving its own."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    cls, sep = getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None)
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "cls_token_id": bos if cls is None else cls,
        "sep_token_id": eos if sep is None else sep,
    }


def token_ids_for(tokenizer: Any, *keys: str) -> dict[str, int | None]:
    """`special_token_ids` restricted to the keys one family's config takes."""
    ids = special_token_ids(tokenizer)
    return {k: ids[k] for k in keys}


def hf_shape_keys(m: Any) -> dict[str, Any]:
    """The shape keys most Hugging Face configs name alike (BERT, RoBERTa, ELECTRA, ModernBERT, Llama), read from
    the `model` section by one mapping instead of one copy per family; a family adds the keys it names its own way
    (dropouts, norm epsilon, options)."""
    return {
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "max_position_embeddings": m.max_position_embeddings,
        "initializer_range": m.initializer_range,
        "tie_word_embeddings": m.tie_word_embeddings,
    }


def bert_config_keys(m: Any) -> dict[str, Any]:
    """`hf_shape_keys` plus the dropout and LayerNorm keys of BERT's config, which RoBERTa and ELECTRA inherit."""
    return {
        **hf_shape_keys(m),
        "hidden_dropout_prob": m.dropout,
        "attention_probs_dropout_prob": m.attention_dropout,
        "layer_norm_eps": m.layer_norm_eps,
    }


def causal_decoder(**fields: Any) -> FamilySpec:
    """The spec of a decoder-only causal LM (GPT-2, Llama): what every such family shares, with `fields` (its
    name, classes, builders, checks) over it. The fine-tune recipe is the one the budget preset's BBC margin was
    measured with (bench/transfer.py; transformers' run_glue defaults otherwise, as there is no published
    classification recipe for these decoders): the same data, optimizer and schedule for every decoder."""
    shared: dict[str, Any] = {
        "task": "causal_lm",
        "objectives": ("causal",),
        "tokenizer_types": ("bpe",),
        "reserved_positions": 0,
        "wraps_sequences": False,
        "has_encoder": False,
        "generative": True,
        "auto_class": "AutoModelForCausalLM",
        "finetune_defaults": {"lr_grid": [3.0e-4, 1.0e-3], "warmup_ratio": 0.1, "weight_decay": 0.01},
        "lora_modules_to_save": ("score",),
    }
    return FamilySpec(**{**shared, **fields})


def masked_encoder(**fields: Any) -> FamilySpec:
    """The spec of an encoder trained as a masked LM (RoBERTa, ModernBERT): the task, objective, tokenizers and
    auto class every such family shares, with `fields` (its name, classes, positions, recipe, builders) over it."""
    shared: dict[str, Any] = {
        "task": "masked_lm",
        "objectives": ("mlm",),
        "tokenizer_types": ("bpe", "wordpiece"),
        "auto_class": "AutoModelForMaskedLM",
    }
    return FamilySpec(**{**shared, **fields})
