"""Exact dedup key: a hash of the normalised content (case, whitespace, punctuation and Unicode form folded),
so copies that differ only in formatting collapse to one."""

from __future__ import annotations

import re
import unicodedata

import xxhash

_PUNCT_WS = re.compile(r"[\W_]+")


def normalize_for_hash(text: str) -> str:
    return _PUNCT_WS.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def content_hash(text: str) -> int:
    """64-bit hash of the normalised text (as a signed int64 so numpy can hold it)."""
    return xxhash.xxh64_intdigest(normalize_for_hash(text).encode("utf-8")) - (1 << 63)
