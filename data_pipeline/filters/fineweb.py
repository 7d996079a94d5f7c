"""FineWeb quality rules (Penedo et al. 2024, "The FineWeb datasets", sec. 3.3), as datatrove's
FineWebQualityFilter (0.10) decides them: over the non-empty lines, the share ending in terminal punctuation, the
share of short lines, the share of characters in duplicated lines, and newlines per word (lists).

They were adopted after C4 and Gopher because each improved downstream scores on top of them. Words are counted
with the regex tokenizer of text_utils, which reproduces the spaCy splits datatrove counts for English.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field

from core.document import Document
from data_pipeline.filters.gopher import _find_duplicates
from data_pipeline.filters.text_utils import TERMINAL_PUNCTUATION, split_words
from runconfig.filters import Share

STOP_CHARS = tuple(TERMINAL_PUNCTUATION)


class FineWebQualityFilter:
    """datatrove's FineWebQualityFilter thresholds (the FineWeb recipe's). Off by default: on top of C4 and Gopher
    the duplicated-line rule alone removes a sizeable share of a crawl; switch it on for FineWeb's recipe."""

    name = "fineweb"
    enabled_by_default = False
    # a curated source (books, verse, reviews, edited corpora) skips it: see runconfig/data.py CLEAN_PRESETS
    presets: ClassVar[dict[str, dict[str, Any]]] = {"curated": {"enabled": False}}

    def __init__(
        self,
        line_punct_thr: Share = 0.12,  # smallest share of lines ending in terminal punctuation
        line_punct_exclude_zero: bool = False,  # a page with no such line at all is kept
        short_line_thr: Share = 0.67,  # largest share of short lines
        short_line_length: Annotated[int, Field(ge=0)] = 30,  # a line this many characters or fewer is short
        char_duplicates_ratio: Share = 0.01,  # largest share of characters in duplicated lines
        new_line_ratio: Annotated[float, Field(ge=0)] = 0.3,  # largest number of newlines per word (lists)
    ):
        self.line_punct_thr = line_punct_thr
        self.line_punct_exclude_zero = line_punct_exclude_zero
        self.short_line_thr = short_line_thr
        self.short_line_length = short_line_length
        self.char_duplicates_ratio = char_duplicates_ratio
        self.new_line_ratio = new_line_ratio

    def __call__(self, doc: Document) -> tuple[bool, str | None] | tuple[bool, str, float]:
        text = doc.text
        lines = [s for s in text.split("\n") if s.strip()]
        if not lines:
            return False, "fineweb:empty", 0
        ratio = sum(1 for s in lines if s.endswith(STOP_CHARS)) / len(lines)
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return False, "fineweb:line_punct_ratio", round(ratio, 4)
        ratio = sum(1 for s in lines if len(s) <= self.short_line_length) / len(lines)
        if ratio > self.short_line_thr:
            return False, "fineweb:short_line_ratio", round(ratio, 4)
        ratio = _find_duplicates(lines)[1] / (len(text) - text.count("\n"))
        if ratio > self.char_duplicates_ratio:
            return False, "fineweb:char_dup_ratio", round(ratio, 4)
        n_words = len(split_words(text))
        ratio = text.count("\n") / n_words if n_words else float("inf")
        if ratio > self.new_line_ratio:
            return False, "fineweb:list_ratio", round(ratio, 4)
        return True, None
