"""Language identification with py3langid (its model ships inside the wheel: nothing is downloaded)."""

from __future__ import annotations

from functools import lru_cache

from core.document import Document


@lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


class LanguageFilter:
    name = "langid"

    def __init__(self, languages: list[str] | None = None, threshold: float = 0.65, max_chars: int = 2_000):
        self.languages = set(languages or [])
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
