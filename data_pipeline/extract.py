"""HTML -> main text with trafilatura, after choosing the charset (declared, then detected) and recording why.

trafilatura does its own guessing when handed bytes, but it does not tell us which charset it used; a
crawl-scale cleaner needs that decision in the report (wrong declarations are common), so we decode first.
"""

from __future__ import annotations

import codecs
import re

from core.document import Document
from data_pipeline.readers.base import alarm_after, decode_bom

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-:.]+)""", re.I)
_HTTP_CHARSET = re.compile(r"charset\s*=\s*[\"']?\s*([A-Za-z0-9_\-:.]+)", re.I)
# Declarations that decode any byte string without error, so a wrong one can only be caught by checking
# whether the bytes are (much more plausibly) UTF-8.
_SINGLE_BYTE = {"latin_1", "iso8859_1", "cp1252", "ascii", "iso8859_15"}


def _norm(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name.strip().strip("\"'")).name
    except LookupError:
        return None


def _is_utf8_with_non_ascii(data: bytes) -> bool:
    if data.isascii():
        return False
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def decode_html(payload: bytes, content_type: str | None = None) -> tuple[str, str, str]:
    """(text, charset, decision). decision is one of: bom, http, meta, utf8-over-declared, detected, replace."""
    bom = decode_bom(payload)  # a byte-order mark outranks any declaration
    if bom is not None:
        return bom[0], bom[1], "bom"
    hm = _HTTP_CHARSET.search(content_type or "")
    http = _norm(hm.group(1)) if hm else None
    m = _META_CHARSET.search(payload[:4096])
    meta = _norm(m.group(1).decode("ascii", "ignore")) if m else None
    for declared, how in ((http, "http"), (meta, "meta")):
        if declared is None:
            continue
        if declared.replace("-", "_") in _SINGLE_BYTE and _is_utf8_with_non_ascii(payload):
            return payload.decode("utf-8"), "utf-8", "utf8-over-declared"
        try:
            return payload.decode(declared), declared, how
        except (UnicodeDecodeError, LookupError):
            continue  # declared wrong: fall through to the next evidence
    try:
        return payload.decode("utf-8"), "utf-8", "detected"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(payload[:200_000]).best()
    if best is not None:
        try:
            return payload.decode(best.encoding), best.encoding, "detected"
        except (UnicodeDecodeError, LookupError):
            pass
    return payload.decode("utf-8", errors="replace"), "utf-8", "replace"


class ExtractTimeout(Exception):
    pass


def _time_limit(seconds: float):
    """A pathological page must not stall a shard (main thread of a worker process only)."""
    return alarm_after(seconds, ExtractTimeout)


class Extractor:
    """trafilatura with the options from `clean.extract`; returns main text or None (nothing worth keeping)."""

    def __init__(
        self,
        favor_precision: bool = True,
        include_tables: bool = True,
        fast: bool = True,
        deduplicate: bool = False,
        timeout_s: float = 5.0,
    ):
        self.kw = {
            "favor_precision": favor_precision,
            "include_tables": include_tables,
            "include_comments": False,
            "deduplicate": deduplicate,
            # fast=True skips trafilatura's readability/jusText fallbacks: several times faster and, on
            # news-style pages, about the same text (see bench/extraction_quality.py).
            "fast": fast,
        }
        self.timeout_s = timeout_s

    def text_from_html(self, html: str, url: str | None = None) -> str | None:
        import trafilatura

        with _time_limit(self.timeout_s):
            return trafilatura.extract(html, url=url, **self.kw)

    def __call__(self, doc: Document) -> tuple[bool, str | None]:
        """Fill doc.text from doc.html; (False, reason) when the page has no extractable text."""
        if doc.html is None:
            return True, None
        html, charset, how = decode_html(doc.html, doc.meta.get("content_type"))
        doc.meta["charset"], doc.meta["charset_source"] = charset, how
        try:
            text = self.text_from_html(html, doc.url)
        except ExtractTimeout:
            return False, "extract:timeout"
        except Exception as e:  # lxml/trafilatura raise many types on hostile markup; count, never crash
            doc.meta["extract_error"] = f"{type(e).__name__}: {e}"[:200]
            return False, "extract:error"
        doc.html = None
        if not text or not text.strip():
            return False, "extract:no_text"
        doc.text = text
        return True, None
