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
    "default_flops_per_token",
    "default_probe_inputs",
    "family_names",
    "get_family",
    "register_family",
    "reject_t5_shape_keys",
    "special_token_ids",
    "token_ids_for",
]


def register_family(spec: FamilySpec, *, replace: bool = False) -> FamilySpec:
    """A whole spec, data and implementation (an outside package's, or a test's)."""
    return FAMILIES.add(spec, replace=replace)


def get_family(name: str) -> FamilySpec:
    """The complete spec: one without a config builder is an error naming the family, not a `None` call deep in
    model building."""
    spec = FAMILIES.get(name)
    if spec.build_config is None:
        raise PluginError(
            f"model.family '{name}': its FamilySpec gives no build_config, so no model can be built"
        )
    return spec


def family_names() -> list[str]:
    return FAMILIES.names()


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
