"""Language identification with py3langid (its model ships inside the wheel: nothing is downloaded)."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, ClassVar

from pydantic import Field

from core.document import Document
from runconfig.filters import Share


@lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


class LanguageFilter:
    """Language identification (py3langid): a page in another language, or too uncertain, is dropped."""

    name = "langid"
    # language ID is unreliable on short text, and a curated source is in the language it was chosen for
    presets: ClassVar[dict[str, dict[str, Any]]] = {"curated": {"enabled": False}}

    def __init__(
        self,
        languages: tuple[str, ...] = ("en",),  # ISO 639-1 codes kept (empty: any language)
        threshold: Share = 0.65,  # smallest probability of the identified language
        max_chars: Annotated[int, Field(gt=0)] = 2_000,  # the prefix classified
    ):
        self.languages = set(languages)
        self.threshold = threshold
        self.max_chars = max_chars  # the prefix decides; classifying megabytes adds nothing but time

    def classify(self, text: str) -> tuple[str, float]:
        lang, prob = _identifier().classify(text[: self.max_chars])
        return lang, float(prob)

    def __call__(self, doc: Document) -> tuple[bool, str | None] | tuple[bool, str, str]:
        lang, prob = self.classify(doc.text)
        doc.meta["lang"], doc.meta["lang_score"] = lang, round(prob, 4)
        if self.languages and lang not in self.languages:
            return False, f"langid:not_{'_'.join(sorted(self.languages))}", f"{lang}:{prob:.3f}"
        if prob < self.threshold:
            return False, "langid:low_confidence", f"{lang}:{prob:.3f}"
        return True, None
