"""Model families as specs (torchtitan's `ModelSpec`): everything the pipeline needs to know about a family in one
object, found by name in `core.registry.FAMILIES`. The data half of a built-in spec (objectives, tokenizer
conventions, positions, typed options) is declared in core/specs.py, which config validation reads; the family's
file here fills in the implementation (`implement_family`). An outside package gives a whole `FamilySpec`
through the `lmstack.families` entry point group.

HF classes are named as strings ('RobertaForMaskedLM' from transformers, or 'package.module:Class') and imported
inside the config builder, so reading a spec needs no torch.
"""

from __future__ import annotations

from typing import Any

from core.errors import PluginError
from core.registry import FAMILIES
from core.specs import FamilySpec, attention_layers, default_flops_per_token, default_probe_inputs, implement

__all__ = [
    "FAMILIES",
    "FamilySpec",
    "attention_layers",
    "default_flops_per_token",
    "default_probe_inputs",
    "family_names",
    "get_family",
    "implement_family",
    "register_family",
]


def register_family(spec: FamilySpec, *, replace: bool = False) -> FamilySpec:
    """A whole spec, data and implementation (an outside package's, or a test's)."""
    return FAMILIES.add(spec, replace=replace)


def implement_family(name: str, **fields: Any) -> FamilySpec:
    """Fills in the implementation of the family declared in core/specs.py."""
    return implement(FAMILIES, name, **fields)


def get_family(name: str) -> FamilySpec:
    """The complete spec: a family declared in core/specs.py whose module here was never written is an error
    naming both places, not a `None` call deep in model building."""
    spec = FAMILIES.get(name)
    if spec.build_config is None:
        raise PluginError(
            f"model.family '{name}' is declared (core/specs.py) but no module implements it "
            f"(pretrain/families/<name>.py calling implement_family)"
        )
    return spec


def family_names() -> list[str]:
    return FAMILIES.names()
