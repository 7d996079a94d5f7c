"""Unicode repair (ftfy: mojibake, HTML entities, bad control chars) and normalisation (NFC/NFKC)."""

from __future__ import annotations

import unicodedata
from typing import Literal

import ftfy

from core.document import Document


class UnicodeFixer:
    """Unicode repair and normalisation; a page left empty by the repair is dropped."""

    name = "unicode"

    def __init__(
        self,
        fix_text: bool = True,  # ftfy mojibake repair
        normalization: Literal["NFC", "NFKC", "none"] = "NFC",
    ):
        self.fix_text = fix_text
        self.normalization = None if normalization == "none" else normalization
        # ftfy normalises too when asked; we keep it separate so either step can be switched off alone.
        self.ftfy_cfg = ftfy.TextFixerConfig(normalization=None, explain=False)

    def __call__(self, doc: Document) -> tuple[bool, str | None]:
        text = doc.text
        # ftfy is slow, so plain ASCII skips it, unless it may hold an HTML entity ("didn&#039;t" in scraped text).
        if self.fix_text and (not text.isascii() or ("&" in text and ";" in text)):
            text = ftfy.fix_text(text, config=self.ftfy_cfg)
        elif self.fix_text:
            text = ftfy.fixes.remove_control_chars(text) if "\x00" in text or "\x1b" in text else text
        if self.normalization and not text.isascii():
            text = unicodedata.normalize(self.normalization, text)
        doc.text = text
        if not text.strip():
            return False, "unicode:empty_after_fix"
        return True, None
