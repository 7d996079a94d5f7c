"""RoBERTa's dynamic masked-LM objective (Liu et al. 2019): the whole spec. The collator is
data_pipeline/objectives/mlm.py; the model side turns on sparse prediction where the family names its MLM head."""

from __future__ import annotations

from typing import Any

from core.specs import ObjectiveSpec
from data_pipeline.objectives.builtin import mlm_collator


def prepare(cfg: Any, model: Any) -> None:
    """Sparse prediction (objective.sparse_prediction) where the family names its MLM head."""
    if not cfg.objective.sparse_prediction:
        return
    head = cfg.model.spec.mlm_head
    if head is not None:
        from pretrain.objectives.sparse_mlm import enable_sparse_prediction

        enable_sparse_prediction(model, head)


SPEC = ObjectiveSpec(
    "mlm", ("full_sentences", "line_by_line"), build_collator=mlm_collator, prepare_model=prepare
)
