"""Cleaning filters: each is a callable Document -> (keep, reason) and may rewrite doc.text (C4 drops lines).

`build_filters(clean_cfg)` gives them in pipeline order, honouring each step's `enabled` switch.
"""

from __future__ import annotations

from collections.abc import Callable

from data_pipeline.document import Document
from data_pipeline.filters.c4 import C4QualityFilter
from data_pipeline.filters.gopher import GopherQualityFilter, GopherRepetitionFilter
from data_pipeline.filters.langid import LanguageFilter
from data_pipeline.filters.unicode import UnicodeFixer

Filter = Callable[[Document], tuple[bool, str | None]]

__all__ = [
    "C4QualityFilter",
    "Filter",
    "GopherQualityFilter",
    "GopherRepetitionFilter",
    "LanguageFilter",
    "UnicodeFixer",
    "build_filters",
]


def build_filters(clean) -> list[tuple[str, Filter]]:
    """(name, filter) in order: unicode repair, language ID, Gopher repetition + quality, C4 (it edits lines)."""
    out: list[tuple[str, Filter]] = []
    if clean.unicode.enabled:
        out.append(("unicode", UnicodeFixer(clean.unicode.fix_text, clean.unicode.normalization)))
    if clean.langid.enabled:
        out.append(("langid", LanguageFilter(clean.langid.languages, clean.langid.threshold)))
    if clean.gopher_repetition.enabled:
        out.append(("gopher_repetition", GopherRepetitionFilter(**clean.gopher_repetition.model_dump(exclude={"enabled"}))))
    if clean.gopher_quality.enabled:
        out.append(("gopher_quality", GopherQualityFilter(**clean.gopher_quality.model_dump(exclude={"enabled"}))))
    if clean.c4.enabled:
        out.append(("c4", C4QualityFilter(**clean.c4.model_dump(exclude={"enabled"}))))
    return out
