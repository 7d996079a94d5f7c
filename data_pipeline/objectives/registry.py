"""Pretraining objectives as specs, found by name (`objective.type`) in `core.registry.OBJECTIVES`.

The data half of a built-in spec (packing modes, framing, typed options, checks) is declared in core/specs.py,
which config validation reads. The collator side is filled in here (data_pipeline/objectives/builtin.py,
electra.py: `implement_objective`), the model side (model settings, wrappers, exports) by pretrain/objectives/.
An outside package gives a whole `ObjectiveSpec` through the `lmstack.objectives` entry point group. A collator
factory imports its collator (and torch) inside itself.
"""

from __future__ import annotations

from typing import Any

from core.registry import OBJECTIVES
from core.specs import ObjectiveSpec, implement, same_length

__all__ = [
    "OBJECTIVES",
    "ObjectiveSpec",
    "get_objective",
    "implement_objective",
    "objective_names",
    "register_objective",
    "same_length",
]


def register_objective(spec: ObjectiveSpec, *, replace: bool = False) -> ObjectiveSpec:
    """A whole spec, data and implementation (an outside package's, or a test's)."""
    return OBJECTIVES.add(spec, replace=replace)


def implement_objective(name: str, **fields: Any) -> ObjectiveSpec:
    """Fills in implementation fields of the objective declared in core/specs.py."""
    return implement(OBJECTIVES, name, **fields)


def get_objective(name: str) -> ObjectiveSpec:
    return OBJECTIVES.get(name)


def objective_names() -> list[str]:
    return OBJECTIVES.names()
