"""C4 quality rules (Raffel et al. 2020, sec. 2.2; TFDS c4_utils.clean_page), line-level and page-level.

Same decisions as datatrove's C4QualityFilter (which ports TFDS), with spaCy's sentence splitting
replaced by the equivalent regex rule in text_utils.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, ClassVar

from core.document import Document
from data_pipeline.filters.text_utils import count_sentences, split_words

CITATION_RE = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
ELLIPSIS = "..."
POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)


def load_bad_words() -> frozenset[str]:
    """English bad-words list shipped with the package (nothing is downloaded at run time)."""
    text = resources.files("data_pipeline.filters").joinpath("badwords_en.txt").read_text("utf-8")
    return frozenset(w.strip().lower() for w in text.splitlines() if w.strip() and not w.startswith("#"))


class C4QualityFilter:
    """C4's line and page rules (it edits lines: a kept page may lose some)."""

    name = "c4"
    # a curated source (books, verse, reviews, edited corpora) skips it: see runconfig/data.py CLEAN_PRESETS
    presets: ClassVar[dict[str, dict[str, Any]]] = {"curated": {"enabled": False}}

    def __init__(
        self,
        split_paragraph: bool = True,
        remove_citations: bool = True,
        filter_no_terminal_punct: bool = True,
        min_num_sentences: int = 5,
        min_words_per_line: int = 3,
        max_word_length: int = 1000,
        filter_lorem_ipsum: bool = True,
        filter_javascript: bool = True,
        filter_curly_bracket: bool = True,
        filter_policy: bool = True,
        filter_bad_words: bool = False,
    ):
        self.split_paragraph = split_paragraph
        self.remove_citations = remove_citations
        self.filter_no_terminal_punct = filter_no_terminal_punct
        self.min_num_sentences = min_num_sentences
        self.min_words_per_line = min_words_per_line
        self.max_word_length = max_word_length
        self.filter_lorem_ipsum = filter_lorem_ipsum
        self.filter_javascript = filter_javascript
        self.filter_curly_bracket = filter_curly_bracket
        self.filter_policy = filter_policy
        self.bad_words = load_bad_words() if filter_bad_words else None
        self.line_stats: dict[str, int] = {}

    def _line_drop(self, why: str) -> None:
        self.line_stats[why] = self.line_stats.get(why, 0) + 1

    def _sentences(self, text: str) -> list[str]:
        """split_paragraph=False: the page as sentences instead of lines."""
        out, cur = [], []
        seen = False
        for tok in split_words(text):
            if seen and tok not in ".!?\"')":
                out.append(" ".join(cur))
                cur, seen = [], False
            cur.append(tok)
            seen = seen or tok in (".", "!", "?")
        if cur:
            out.append(" ".join(cur))
        return out

    def __call__(self, doc: Document) -> tuple[bool, str | None] | tuple[bool, str, object]:
        lines = doc.text.splitlines() if self.split_paragraph else self._sentences(doc.text)
        num_sentences = 0
        kept: list[str] = []
        for line in lines:
            line = line.strip()
            words = line.split()
            if self.max_word_length != -1 and any(len(w) > self.max_word_length for w in words):
                self._line_drop("too_long_word")
                continue
            if self.remove_citations:
                line = CITATION_RE.sub("", line)
            if self.filter_no_terminal_punct and (
                not line.endswith(END_PUNCTUATION) or line.endswith(ELLIPSIS)
            ):
                self._line_drop("no_terminal_punct")
                continue
            if len(words) < self.min_words_per_line:
                self._line_drop("too_few_words")
                continue
            low = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in low:
                return False, "c4:lorem_ipsum", line[:100]
            if self.filter_javascript and "javascript" in low:
                self._line_drop("javascript")
                continue
            if self.filter_curly_bracket and "{" in line:
                return False, "c4:curly_bracket", line[:100]
            if self.filter_policy and any(p in low for p in POLICY_SUBSTRINGS):
                self._line_drop("policy")
                continue
            if self.bad_words is not None and self.bad_words.intersection(re.findall(r"[a-z']+", low)):
                return (
                    False,
                    "c4:bad_words",
                    sorted(self.bad_words.intersection(re.findall(r"[a-z']+", low)))[:5],
                )
            if self.min_num_sentences != -1:
                num_sentences += count_sentences(split_words(line)) if self.split_paragraph else 1
            kept.append(line)
        if num_sentences < self.min_num_sentences:
            return False, "c4:too_few_sentences", num_sentences
        doc.text = ("\n" if self.split_paragraph else " ").join(kept).strip()
        return True, None
