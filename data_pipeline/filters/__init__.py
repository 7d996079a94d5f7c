"""Cleaning filters: each is a callable Document -> (keep, reason[, measured value]) and may rewrite doc.text
(C4 drops lines, PII redaction replaces addresses). A filter may keep counts in a `stats` Counter (kept with
its shard's marker and summed in the clean report). They are registered by name (registry.py); `build_filters(clean_cfg)` gives them in the
configured order (`data.clean.filters`, default: the built-ins' order), honouring each built-in's `enabled`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.document import Document
from data_pipeline.filters.c4 import C4QualityFilter
from data_pipeline.filters.fineweb import FineWebQualityFilter
from data_pipeline.filters.gopher import GopherQualityFilter, GopherRepetitionFilter
from data_pipeline.filters.langid import LanguageFilter
from data_pipeline.filters.pii import PiiFormatter
from data_pipeline.filters.registry import FILTERS, build_filters, get_filter, register_filter
from data_pipeline.filters.unicode import UnicodeFixer
from data_pipeline.filters.url import URLFilter, url_filter

Filter = Callable[[Document], tuple[bool, str | None] | tuple[bool, str | None, Any]]

__all__ = [
    "FILTERS",
    "C4QualityFilter",
    "Filter",
    "FineWebQualityFilter",
    "GopherQualityFilter",
    "GopherRepetitionFilter",
    "LanguageFilter",
    "PiiFormatter",
    "URLFilter",
    "UnicodeFixer",
    "build_filters",
    "get_filter",
    "register_filter",
]

register_filter("url", url_filter)
register_filter("unicode", UnicodeFixer)
register_filter("langid", LanguageFilter)
register_filter("gopher_repetition", GopherRepetitionFilter)
register_filter("gopher_quality", GopherQualityFilter)
register_filter("c4", C4QualityFilter)
register_filter("fineweb", FineWebQualityFilter)
register_filter("pii", PiiFormatter)
