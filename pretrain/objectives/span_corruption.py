"""T5's span-corruption objective (Raffel et al. 2020): the whole spec. The collator is
data_pipeline/objectives/span_corruption.py; a packed block holds the raw length the corruption shrinks to
`packing.seq_len` (t5_lengths)."""

from __future__ import annotations

from core.specs import ObjectiveSpec
from data_pipeline.objectives.builtin import span_block_length, span_collator

SPEC = ObjectiveSpec(
    "span_corruption",
    ("t5_spans",),
    wrap_bos=False,
    build_collator=span_collator,
    block_length=span_block_length,
)
