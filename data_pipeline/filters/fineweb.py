"""FineWeb quality rules (Penedo et al. 2024, "The FineWeb datasets", sec. 3.3), as datatrove's
FineWebQualityFilter decides them: the share of lines ending in punctuation, the share of characters in
duplicated lines, the share of short lines, and newlines per word (lists).

They were adopted after C4 and Gopher because each improved downstream scores on top of them. Words are
counted with the regex tokenizer of text_utils (datatrove uses NLTK's word_tokenize; both split punctuation
and contractions off, which is all a count needs).
"""

from __future__ import annotations

from core.document import Document
from data_pipeline.filters.gopher import _find_duplicates
from data_pipeline.filters.text_utils import split_words

STOP_CHARS = (".", "'", '"', "!", "?")


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
        chars = len(text) - text.count("\n")
        if not chars:  # datatrove divides by zero here; an empty page is no page
            return False, "fineweb:empty", 0
        lines = text.split("\n")
        ratio = sum(1 for s in lines if s.endswith(STOP_CHARS)) / len(lines)
        if ratio <= self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return False, "fineweb:line_punct_ratio", round(ratio, 4)
        ratio = sum(1 for s in lines if len(s) <= self.short_line_length) / len(lines)
        if ratio >= self.short_line_thr:
            return False, "fineweb:short_line_ratio", round(ratio, 4)
        ratio = _find_duplicates([s for s in lines if s.strip()])[1] / chars
        if ratio >= self.char_duplicates_ratio:
            return False, "fineweb:char_dup_ratio", round(ratio, 4)
        n_words = len(split_words(text))
        ratio = text.count("\n") / n_words if n_words else float("inf")
        if ratio > self.new_line_ratio:
            return False, "fineweb:list_ratio", round(ratio, 4)
        return True, None
