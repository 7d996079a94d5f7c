"""The model side of the pretraining objectives: settings an objective relies on in the model it trains, the
module it trains (ELECTRA's generator + discriminator) and its own export. The collator side is in
data_pipeline/objectives/, the data specs in core/specs.py; importing this package fills in the model side of
the built-in objectives.

`prepare_model` and `wrap_model` are what the trainer, the export and the memory plan call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.specs import ElectraOptions, generator_shape
from data_pipeline.objectives import get_objective, implement_objective
from pretrain.families import get_family

if TYPE_CHECKING:
    from runconfig.run import RunConfig

__all__ = ["prepare_model", "wrap_model"]


def prepare_model(cfg: RunConfig, model: Any) -> None:
    """Model settings the objective relies on; the trainer calls it once on the model it trains."""
    spec = get_objective(cfg.objective.type)
    if spec.prepare_model is not None:
        spec.prepare_model(cfg, model)


def wrap_model(cfg: RunConfig, model: Any, tokenizer: Any) -> Any:
    """The module the trainer trains and checkpoints: the family's model, or the objective's wrapper around it
    (ELECTRA's generator + discriminator). Export rebuilds the same module to load the checkpoint."""
    spec = get_objective(cfg.objective.type)
    return model if spec.wrap_model is None else spec.wrap_model(cfg, model, tokenizer)


def mlm_prepare(cfg: Any, model: Any) -> None:
    """Sparse prediction (objective.sparse_prediction) where the family names its MLM head."""
    if not cfg.objective.sparse_prediction:
        return
    head = get_family(cfg.model.family).mlm_head
    if head is not None:
        from pretrain.objectives.sparse_mlm import enable_sparse_prediction

        enable_sparse_prediction(model, head)


def causal_prepare(cfg: Any, model: Any) -> None:
    """Training never uses a KV cache: GPT-2 and Llama default to `use_cache=True` and would build a DynamicCache
    every forward and return each layer's K and V. Document masking needs it off too: transformers builds the
    per-document attention from the restarted position_ids only when no cache is created. Off, each block's
    compiled graph no longer specialises on its layer index either, so all blocks share one graph
    (`compile_blocks`)."""
    model.config.use_cache = False
    if cfg.objective.chunked_loss:
        from pretrain.losses import enable_chunked_loss

        enable_chunked_loss(model)


def electra_wrap(cfg: Any, model: Any, tokenizer: Any) -> Any:
    """The family's discriminator + a smaller generator of the same family sharing its embeddings (the family's
    RTD adapter, `FamilySpec.rtd`, builds both): the module trained."""
    from pretrain.objectives.rtd import ReplacedTokenDetection, rtd_family

    opts = ElectraOptions.model_validate(cfg.objective.options)
    adapter = rtd_family(get_family(cfg.model.family))
    shape = generator_shape(cfg.model.hidden_size, cfg.model.num_layers, opts)
    if adapter.adjust_shape is not None:
        shape = adapter.adjust_shape(shape, cfg.model, opts)
    discriminator, generator = adapter.pair(model, shape)
    return ReplacedTokenDetection(
        discriminator,
        generator,
        tokenizer,
        opts.discriminator_weight,
        opts.temperature,
        adapter.mlm_transform,
    )


def electra_export(cfg: Any, module: Any, out: Any, tokenizer: Any) -> Any:
    from pretrain.objectives.rtd import rtd_family

    return rtd_family(get_family(cfg.model.family)).export(cfg, module, out, tokenizer)


implement_objective("mlm", prepare_model=mlm_prepare)
implement_objective("causal", prepare_model=causal_prepare)
implement_objective("electra", wrap_model=electra_wrap, export=electra_export)
