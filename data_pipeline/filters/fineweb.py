"""FineWeb quality rules (Penedo et al. 2024, "The FineWeb datasets", sec. 3.3), as datatrove's
FineWebQualityFilter (0.10) decides them: over the non-empty lines, the share ending in terminal punctuation, the
share of short lines, the share of characters in duplicated lines, and newlines per word (lists).

They were adopted after C4 and Gopher because each improved downstream scores on top of them. Words are counted
with the regex tokenizer of text_utils, which reproduces the spaCy splits datatrove counts for English.
"""

from __future__ import annotations

from core.document import Document
from data_pipeline.filters.gopher import _find_duplicates
from data_pipeline.filters.text_utils import TERMINAL_PUNCTUATION, split_words

STOP_CHARS = tuple(TERMINAL_PUNCTUATION)


class FineWebQualityFilter:
    name = "fineweb"

    def __init__(
        self,
        line_punct_thr: float = 0.12,
        line_punct_exclude_zero: bool = False,
        short_line_thr: float = 0.67,
        short_line_length: int = 30,
        char_duplicates_ratio: float = 0.01,
        new_line_ratio: float = 0.3,
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
