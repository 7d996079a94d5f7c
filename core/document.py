"""The unit that flows through reading, extraction and cleaning."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Document:
    # Stable across reruns: derived from source name + file + record offset (or the record's own id).
    id: str
    text: str = ""
    html: bytes | None = None  # raw HTML payload, before extraction
    url: str | None = None
    timestamp: str | None = None  # ISO 8601
    source: str = ""
    # Free-form: label (text_folder), charset, content type, file and offset for error reports.
    meta: dict[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        """The cleaned-shard row: what the tokenizer stage reads."""
        rec = {
            "id": self.id,
            "text": self.text,
            "url": self.url,
            "timestamp": self.timestamp,
            "source": self.source,
        }
        if "label" in self.meta:
            rec["label"] = self.meta["label"]
        return rec


def stable_id(*parts: object) -> str:
    """Short content-independent id; the same input location always gives the same id."""
    h = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=10)
    return h.hexdigest()


def in_holdout(doc_id: str, fraction: float, seed: int = 0) -> bool:
    """Deterministic hold-out membership by id hash: pretraining excludes these, fine-tuning uses them."""
    if fraction <= 0:
        return False
    h = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < fraction
