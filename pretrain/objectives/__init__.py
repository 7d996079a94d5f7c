"""The model side of the pretraining objectives: settings an objective relies on in the model it trains, the
module it trains (ELECTRA's generator + discriminator) and its own export. The collator side is in
data_pipeline/objectives/, the data specs in core/specs.py; importing this package fills in the model side of
the built-in objectives.

`prepare_model` and `wrap_model` are what the trainer, the export and the memory plan call.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
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


_NO_PACKED_SEQUENCES: ContextVar[bool] = ContextVar("lmstack_no_packed_sequences", default=False)


def _no_packed_sequence_detection(model: Any) -> None:
    """Without document masking a batch never holds packed documents, yet with no KV cache transformers looks for
    them in every forward's position_ids (masking_utils.find_packed_sequence_indices), eagerly and ending in a
    `.all()` read on the host: one device sync per micro-batch (tests/pretrain/test_host_syncs.py). During this
    model's forward the detection answers "none" without reading; any other model keeps transformers' own."""
    from transformers import masking_utils

    find = masking_utils.find_packed_sequence_indices
    if not getattr(find, "_lmstack", False):

        def find_packed_sequence_indices(position_ids: Any) -> Any:
            return None if _NO_PACKED_SEQUENCES.get() else find(position_ids)

        find_packed_sequence_indices._lmstack = True  # type: ignore[attr-defined]
        masking_utils.find_packed_sequence_indices = find_packed_sequence_indices
    tokens: list[Token[bool]] = []
    model.register_forward_pre_hook(lambda *_: tokens.append(_NO_PACKED_SEQUENCES.set(True)))
    model.register_forward_hook(lambda *_: _NO_PACKED_SEQUENCES.reset(tokens.pop()))


def causal_prepare(cfg: Any, model: Any) -> None:
    """Training never uses a KV cache: GPT-2 and Llama default to `use_cache=True` and would build a DynamicCache
    every forward and return each layer's K and V. Document masking needs it off too: transformers builds the
    per-document attention from the restarted position_ids only when no cache is created. Off, each block's
    compiled graph no longer specialises on its layer index either, so all blocks share one graph
    (`compile_blocks`)."""
    model.config.use_cache = False
    if not cfg.objective.document_masking:
        _no_packed_sequence_detection(model)
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
