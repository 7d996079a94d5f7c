"""GPT's causal-LM objective (Radford et al. 2019): the whole spec. The collator is
data_pipeline/objectives/causal.py (document masking, packed blocks); the model side turns the KV cache off."""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any

from core.specs import ObjectiveSpec
from data_pipeline.objectives.builtin import causal_collator

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


def prepare(cfg: Any, model: Any) -> None:
    """Training never uses a KV cache: GPT-2 and Llama default to `use_cache=True` and would build a DynamicCache
    every forward and return each layer's K and V. Document masking needs it off too: transformers builds the
    per-document attention from the restarted position_ids only when no cache is created. Off, each block's
    compiled graph no longer specialises on its layer index either, so all blocks share one graph
    (`compile_blocks`)."""
    model.config.use_cache = False
    if not cfg.objective.document_masking:
        _no_packed_sequence_detection(model)
    if cfg.objective.chunked_loss:
        from pretrain.objectives.losses import enable_chunked_loss

        enable_chunked_loss(model)


SPEC = ObjectiveSpec(
    "causal",
    ("contiguous", "line_by_line"),
    wrap_bos=False,
    build_collator=causal_collator,
    prepare_model=prepare,
)
