"""Pretraining objectives as specs, found by name (`objective.type`), as llm-foundry's registries.

An objective is its collator module plus one `register_objective(ObjectiveSpec(...))` (a module listed in
`BUILTIN`, or an outside package's `lmstack.objectives` entry point). Packing, the trainer and config validation
read only the spec, never a concrete objective. A spec module must import without torch (config validation
reads it): import the collator inside the factory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runconfig.registry import Registry

if TYPE_CHECKING:
    from runconfig.objective import ObjectiveConfig
    from runconfig.run import RunConfig

BUILTIN = ("data_pipeline.objectives.builtin", "data_pipeline.objectives.electra")


def same_length(seq_len: int, objective: ObjectiveConfig) -> int:
    return seq_len


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    packing: tuple[str, ...]  # packing.mode values it fits
    # (run config, HF tokenizer) -> callable(list of packed samples) -> the model's forward kwargs as tensors.
    build_collator: Callable[[RunConfig, Any], Callable[[list[dict[str, Any]]], dict[str, Any]]]
    # Stream tokens one packed block holds for `packing.seq_len` model inputs (T5 spans: the raw length the
    # corruption shrinks to seq_len); computed once at packing time.
    block_length: Callable[[int, ObjectiveConfig], int] = same_length
    wrap_bos: bool = True  # line_by_line framing: `<s> doc </s>` (MLM) or `doc </s>` (causal)
    # Settings the objective relies on, applied once to the built model (GPT document masking: use_cache=False).
    prepare_model: Callable[[RunConfig, Any], None] | None = None
    # Objectives that wrap the family's model (a generator + discriminator pair) return the module to train:
    # (cfg, family model, tokenizer) -> module; None: the family's model is trained as built.
    wrap_model: Callable[[RunConfig, Any, Any], Any] | None = None
    # Objectives with their own export (e.g. two HF folders) write it: (cfg, trained module, out dir, tokenizer)
    # -> the export reloaded from disk as a module whose probe logits must match the engine's (parity), or None.
    export: Callable[[RunConfig, Any, Any, Any], Any] | None = None
    # Families this objective trains beyond those that list it in FamilySpec.objectives (a plug-in objective
    # need not edit family files): (family spec) -> bool.
    trains: Callable[[Any], bool] | None = None
    validate: Callable[[RunConfig], None] | None = None  # objective-specific config checks (raise naming the key)
    # A typed section (pydantic, unknown keys rejected) for the objective's own `objective.options` keys.
    options: type | None = None
    # The objective reads every position with a bidirectional encoder (replaced-token detection): a family whose
    # spec says has_encoder=False is refused at load with that reason.
    needs_encoder: bool = False

    def parse_options(self, options: dict[str, Any]) -> Any:
        """`objective.options` as the spec's typed section, defaults filled in (None if it has none)."""
        return None if self.options is None else self.options.model_validate(options)


OBJECTIVES: Registry[ObjectiveSpec] = Registry("objective.type", "lmstack.objectives", ObjectiveSpec, BUILTIN)


def register_objective(spec: ObjectiveSpec, *, replace: bool = False) -> ObjectiveSpec:
    return OBJECTIVES.register(spec, replace=replace)


def get_objective(name: str) -> ObjectiveSpec:
    return OBJECTIVES.get(name)


def objective_names() -> list[str]:
    return OBJECTIVES.names()
