"""Pretraining objectives: batched, vectorised collators (RoBERTa MLM, GPT causal LM, T5 span corruption, ELECTRA's
replaced-token detection, and any registered plug-in), each described by an `ObjectiveSpec` in
`core.registry.OBJECTIVES` (registry.py). The model side of an objective (model settings, wrappers, exports) is in
pretrain/objectives/.

`build_collator(cfg, tokenizer)` is the one entry point the trainer uses (contract 4): it returns a callable that
turns the loader's list of per-sample dicts into exactly the keyword arguments the Hugging Face model's forward
takes, as int64 torch tensors. The collator classes are exported lazily: importing this package (config
validation, packing) does not import torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from data_pipeline.objectives.registry import (
    ObjectiveSpec,
    get_objective,
    objective_names,
    register_objective,
)

if TYPE_CHECKING:
    from runconfig.run import RunConfig

Collator = Callable[[list[dict[str, Any]]], dict[str, Any]]

_LAZY = {
    "CausalCollator": "data_pipeline.objectives.causal",
    "MLMCollator": "data_pipeline.objectives.mlm",
    "SpanCorruptionCollator": "data_pipeline.objectives.span_corruption",
}

__all__ = [
    "CausalCollator",
    "Collator",
    "MLMCollator",
    "ObjectiveSpec",
    "SpanCorruptionCollator",
    "build_collator",
    "get_objective",
    "objective_names",
    "register_objective",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_collator(cfg: RunConfig, tokenizer: Any) -> Collator:
    """The collator of `cfg.objective.type`, seeded with `cfg.run.seed`. `line_by_line` packing pads each batch
    to its longest sample."""
    spec = cfg.objective.spec
    if spec.build_collator is None:
        raise ValueError(f"objective.type: '{spec.name}' has no collator registered")
    return spec.build_collator(cfg, tokenizer)
