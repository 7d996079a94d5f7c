"""The pretraining objectives, one module each giving its whole `ObjectiveSpec` as `SPEC` (mlm.py, causal.py,
span_corruption.py, electra.py; rtd.py, sparse_mlm.py and losses.py are model-side pieces they use): packing modes,
framing, typed options and checks, the collator factory (data_pipeline/objectives/) and the model side (settings an
objective relies on in the model it trains, the module it trains, its own export). Each has one `lmstack.objectives`
entry point in pyproject.toml.

`prepare_model` and `wrap_model` are what the trainer, the export and the memory plan call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runconfig.run import RunConfig

__all__ = ["prepare_model", "wrap_model"]


def prepare_model(cfg: RunConfig, model: Any) -> None:
    """Model settings the objective relies on; the trainer calls it once on the model it trains."""
    spec = cfg.objective.spec
    if spec.prepare_model is not None:
        spec.prepare_model(cfg, model)


def wrap_model(cfg: RunConfig, model: Any, tokenizer: Any) -> Any:
    """The module the trainer trains and checkpoints: the family's model, or the objective's wrapper around it
    (ELECTRA's generator + discriminator). Export rebuilds the same module to load the checkpoint."""
    spec = cfg.objective.spec
    return model if spec.wrap_model is None else spec.wrap_model(cfg, model, tokenizer)
