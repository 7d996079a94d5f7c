"""Gopher quality and repetition rules (Rae et al. 2021, appendix A, table A1), as datatrove implements them.

Words come from the regex tokenizer in text_utils (spaCy-equivalent splits; punctuation is its own token,
as in the reference, which matters for the symbol and alphabetic-word ratios).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, ClassVar

from core.document import Document
from data_pipeline.filters.text_utils import PUNCTUATION_SET, split_words

_HAS_ALPHA = re.compile(r"[^\W\d_]")
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
DUP_N_GRAMS = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))


class GopherQualityFilter:
    """Gopher's quality rules (null switches one rule off)."""

    name = "gopher_quality"
    # a curated source (books, verse, reviews, edited corpora) skips it: see runconfig/data.py CLEAN_PRESETS
    presets: ClassVar[dict[str, dict[str, Any]]] = {"curated": {"enabled": False}}

    def __init__(
        self,
        min_doc_words: int | None = 50,
        max_doc_words: int | None = 100_000,
        min_avg_word_length: float | None = 3,
        max_avg_word_length: float | None = 10,
        max_symbol_word_ratio: float | None = 0.1,
        max_bullet_lines_ratio: float | None = 0.9,
        max_ellipsis_lines_ratio: float | None = 0.3,
        max_non_alpha_words_ratio: float | None = 0.8,
        min_stop_words: int | None = 2,
        stop_words: tuple[str, ...] = STOP_WORDS,  # min_stop_words of these words must occur
    ):
        self.min_doc_words, self.max_doc_words = min_doc_words, max_doc_words
        self.min_avg_word_length, self.max_avg_word_length = min_avg_word_length, max_avg_word_length
        self.max_symbol_word_ratio = max_symbol_word_ratio
        self.max_bullet_lines_ratio = max_bullet_lines_ratio
        self.max_ellipsis_lines_ratio = max_ellipsis_lines_ratio
        self.max_non_alpha_words_ratio = max_non_alpha_words_ratio
        self.min_stop_words = min_stop_words
        self.stop_words = frozenset(stop_words)

    def __call__(self, doc: Document) -> tuple[bool, str | None] | tuple[bool, str, float]:
        text = doc.text
        words = split_words(text)
        n_words = len(words)
        content = [w for w in words if not PUNCTUATION_SET.issuperset(w)]
        n_content = len(content)
        # A drop returns the measured value beside the reason (kept with the dropped-document samples).
        if self.min_doc_words and n_content < self.min_doc_words:
            return False, "gopher:short_doc", n_content
        if self.max_doc_words and n_content > self.max_doc_words:
            return False, "gopher:long_doc", n_content
        avg = sum(map(len, content)) / n_content if n_content else 0.0
        if self.min_avg_word_length and avg < self.min_avg_word_length:
            return False, "gopher:below_avg_word_length", round(avg, 4)
        if self.max_avg_word_length and avg > self.max_avg_word_length:
            return False, "gopher:above_avg_word_length", round(avg, 4)
        if not n_words:
            return False, "gopher:short_doc", 0
        hashes = text.count("#") / n_words
        if self.max_symbol_word_ratio and hashes > self.max_symbol_word_ratio:
            return False, "gopher:too_many_hashes", round(hashes, 4)
        ell = (text.count("...") + text.count("…")) / n_words
        if self.max_symbol_word_ratio and ell > self.max_symbol_word_ratio:
            return False, "gopher:too_many_ellipsis", round(ell, 4)
        lines = text.splitlines()
        bullets = sum(s.lstrip().startswith(("•", "-")) for s in lines) / len(lines) if lines else 0.0
        if self.max_bullet_lines_ratio and lines and bullets > self.max_bullet_lines_ratio:
            return False, "gopher:too_many_bullets", round(bullets, 4)
        end_ell = sum(s.rstrip().endswith(("...", "…")) for s in lines) / len(lines) if lines else 0.0
        if self.max_ellipsis_lines_ratio and lines and end_ell > self.max_ellipsis_lines_ratio:
            return False, "gopher:too_many_end_ellipsis", round(end_ell, 4)
        alpha = sum(1 for w in words if _HAS_ALPHA.search(w)) / n_words
        if self.max_non_alpha_words_ratio and alpha < self.max_non_alpha_words_ratio:
            return False, "gopher:below_alpha_threshold", round(alpha, 4)
        stops = len(self.stop_words.intersection(words))
        if self.min_stop_words and stops < self.min_stop_words:
            return False, "gopher:not_enough_stop_words", stops
        return True, None


def _find_duplicates(items: list[str]) -> tuple[int, int]:
    seen: set[str] = set()
    dup_n = dup_chars = 0
    for x in items:
        if x in seen:
            dup_n += 1
            dup_chars += len(x)
        else:
            seen.add(x)
    return dup_n, dup_chars


def _top_ngram_chars(words: list[str], n: int) -> int:
    grams = Counter(zip(*(words[i:] for i in range(n)), strict=False))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    return (sum(map(len, gram)) + n - 1) * count  # length of " ".join(gram), times its count


def _dup_ngram_chars(words: list[str], n: int) -> int:
    """Characters inside n-grams seen before, skipping past each repeat (datatrove's find_all_duplicate)."""
    last = len(words) - n + 1
    grams = list(zip(*(words[i:] for i in range(n)), strict=False))
    if len(set(grams)) == len(grams):  # no n-gram repeats at all (the common case): nothing to walk
        return 0
    seen: set[tuple[str, ...]] = set()
    repeated, idx = 0, 0
    while idx < last:
        gram = grams[idx]
        if gram in seen:
            repeated += sum(map(len, gram))
            idx += n
        else:
            seen.add(gram)
            idx += 1
    return repeated


class GopherRepetitionFilter:
    """Gopher's repetition rules: duplicated lines, paragraphs and n-grams (null switches one rule off)."""

    name = "gopher_repetition"
    # a curated source (books, verse, reviews, edited corpora) skips it: see runconfig/data.py CLEAN_PRESETS
    presets: ClassVar[dict[str, dict[str, Any]]] = {"curated": {"enabled": False}}
    _para = re.compile(r"\n{2,}")
    _line = re.compile(r"\n+")

    def __init__(
        self,
        dup_line_frac: float | None = 0.3,
        dup_para_frac: float | None = 0.3,
        dup_line_char_frac: float | None = 0.2,
        dup_para_char_frac: float | None = 0.2,
        # (n, largest share of characters in the most frequent n-gram)
        top_n_grams: tuple[tuple[int, float], ...] = ((2, 0.2), (3, 0.18), (4, 0.16)),
        # (n, largest share of characters in duplicated n-grams)
        dup_n_grams: tuple[tuple[int, float], ...] = DUP_N_GRAMS,
    ):
        self.dup_line_frac, self.dup_para_frac = dup_line_frac, dup_para_frac
        self.dup_line_char_frac, self.dup_para_char_frac = dup_line_char_frac, dup_para_char_frac
        self.top_n_grams = [(int(n), float(f)) for n, f in top_n_grams]
        self.dup_n_grams = [(int(n), float(f)) for n, f in dup_n_grams]

    def __call__(self, doc: Document) -> tuple[bool, str | None] | tuple[bool, str, float]:
        text = doc.text
        if not text:
            return False, "gopher_rep:empty"
        paragraphs = self._para.split(text.strip())
        n_dup, chars = _find_duplicates(paragraphs)
        if self.dup_para_frac and n_dup / len(paragraphs) > self.dup_para_frac:
            return False, "gopher_rep:dup_para_frac", round(n_dup / len(paragraphs), 4)
        if self.dup_para_char_frac and chars / len(text) > self.dup_para_char_frac:
            return False, "gopher_rep:dup_para_char_frac", round(chars / len(text), 4)
        lines = self._line.split(text)
        n_dup, chars = _find_duplicates(lines)
        if self.dup_line_frac and n_dup / len(lines) > self.dup_line_frac:
            return False, "gopher_rep:dup_line_frac", round(n_dup / len(lines), 4)
        if self.dup_line_char_frac and chars / len(text) > self.dup_line_char_frac:
            return False, "gopher_rep:dup_line_char_frac", round(chars / len(text), 4)
        words = split_words(text)
        for n, frac in self.top_n_grams:
            share = _top_ngram_chars(words, n) / len(text) if len(words) >= n else 0.0
            if share > frac:
                return False, f"gopher_rep:top_{n}_gram", round(share, 4)
        for n, frac in self.dup_n_grams:
            share = _dup_ngram_chars(words, n) / len(text)
            if share > frac:
                return False, f"gopher_rep:duplicated_{n}_n_grams", round(share, 4)
        return True, None
