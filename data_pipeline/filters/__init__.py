"""Cleaning filters: each is a callable Document -> (keep, reason[, measured value]) and may rewrite doc.text
(C4 drops lines). They are registered by name (registry.py); `build_filters(clean_cfg)` gives them in the
configured order (`data.clean.filters`, default: the built-ins' order), honouring each built-in's `enabled`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from data_pipeline.document import Document
from data_pipeline.filters.c4 import C4QualityFilter
from data_pipeline.filters.gopher import GopherQualityFilter, GopherRepetitionFilter
from data_pipeline.filters.langid import LanguageFilter
from data_pipeline.filters.registry import FILTERS, build_filters, get_filter, register_filter
from data_pipeline.filters.unicode import UnicodeFixer

Filter = Callable[[Document], tuple[bool, str | None] | tuple[bool, str | None, Any]]

__all__ = [
    "FILTERS",
    "C4QualityFilter",
    "Filter",
    "GopherQualityFilter",
    "GopherRepetitionFilter",
    "LanguageFilter",
    "UnicodeFixer",
    "build_filters",
    "get_filter",
    "register_filter",
]

register_filter("unicode", UnicodeFixer)
register_filter("langid", LanguageFilter)
register_filter("gopher_repetition", GopherRepetitionFilter)
register_filter("gopher_quality", GopherQualityFilter)
register_filter("c4", C4QualityFilter)
