"""Pretraining objectives as specs, found by name (`objective.type`) in `core.registry.OBJECTIVES`.

Each built-in objective is one module in pretrain/objectives/ (the floor that sees both halves) giving its whole
spec: packing modes, framing, typed options and checks, the collator factory from here (builtin.py, electra.py)
and the model side; plus one `lmstack.objectives` entry point in pyproject.toml, as an outside package's. A
collator factory imports its collator (and torch) inside itself.
"""

from __future__ import annotations

from core.registry import OBJECTIVES
from core.specs import ObjectiveSpec, same_length

__all__ = [
    "OBJECTIVES",
    "ObjectiveSpec",
    "get_objective",
    "objective_names",
    "register_objective",
    "same_length",
]


# A whole spec, data and implementation (an outside package's, or a test's), found by name, and the names known:
# the registry's own methods under the names the objectives' callers read.
register_objective = OBJECTIVES.add
get_objective = OBJECTIVES.get
objective_names = OBJECTIVES.names
