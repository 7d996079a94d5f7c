"""The formatter base class: a chain step that rewrites text and keeps every document.

A filter answers keep or drop; a formatter answers with new text. Giving it its own base (as datatrove's
`BaseFormatter` beside its `BaseFilter`) keeps the chain's contract honest: a formatter cannot drop, and what it
counts (documents it changed, spans it replaced per kind) is reported apart from the filters' drop reasons, in the
clean report's `formatter_stats` (`<step>:documents_changed`, `<step>:<kind>`).
"""

from __future__ import annotations

from collections import Counter

from core.document import Document

DOCUMENTS_CHANGED = "documents_changed"


class Formatter:
    """Subclasses implement `format(text) -> text` and count replacements per kind in `self.stats`."""

    name = "formatter"

    def __init__(self) -> None:
        # per kind, plus documents changed; summed over a shard into its marker
        self.stats: Counter = Counter()

    def format(self, text: str) -> str:
        raise NotImplementedError

    def __call__(self, doc: Document) -> tuple[bool, None]:
        """The chain's step call: the text rewritten in place, the document always kept."""
        new = self.format(doc.text)
        if new != doc.text:
            self.stats[DOCUMENTS_CHANGED] += 1
            doc.text = new
        return True, None
