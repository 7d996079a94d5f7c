"""BERT's static masking as an objective of its own, for bench/dynamic_vs_static.py (issue 65: the product's
`objective.static_masking` key existed only for that benchmark).

The benchmark trains its "peer" run with `objective.type=bench._static_masking:STATIC_MLM`, a `module.path:Name`
reference, as an outside package would plug an objective in: RoBERTa's MLM spec with a collator that draws one
mask per sequence for the whole run (`MLMCollator(static_masking=True)`: the mask of epoch 0, served again every
epoch) instead of a fresh one per epoch. Everything else (masking settings, packing, the model side) is the `mlm`
objective's, so the two runs differ in the masking alone. The run's processes import it from the checkout, which
the benchmark's child processes have on their PYTHONPATH (bench/_common.py `child_env`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from data_pipeline.objectives.builtin import masking_kwargs
from pretrain.objectives.mlm import SPEC as MLM


def static_mlm_collator(cfg: Any, tokenizer: Any):
    """The MLM collator with each sequence's epoch-0 mask fixed for the whole run."""
    from data_pipeline.objectives.mlm import MLMCollator

    return MLMCollator(tokenizer, **masking_kwargs(cfg), static_masking=True)


# Trains every family that trains the masked LM.
STATIC_MLM = dataclasses.replace(
    MLM,
    name="static_mlm",
    build_collator=static_mlm_collator,
    trains=lambda family: "mlm" in family.objectives,
)
