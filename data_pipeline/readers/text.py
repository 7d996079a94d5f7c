"""The `text` and `text_folder` readers: a whole file is one document; `text_folder` can take each document's label
from the folder it sits in (`label_from_folder`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from core.document import Document, stable_id
from data_pipeline.readers.base import (
    DECOMP_ERRORS,
    ErrorLog,
    ReaderTraits,
    SourceFile,
    decode_text,
    looks_binary,
    open_decompressed,
)

if TYPE_CHECKING:
    from data_pipeline.readers import WorkShard
    from runconfig.data import SourceConfig


def read_text_file(
    src: SourceFile, source: str, errors: ErrorLog, max_bytes: int, label: str | None = None
) -> Iterator[Document]:
    """A whole file is one document (news article, book); charset: UTF-8, else detected and recorded."""
    try:
        with open_decompressed(src.path) as f:
            data = f.read(max_bytes + 1)
    except DECOMP_ERRORS as e:  # includes PermissionError, IsADirectoryError, broken symlinks
        errors.add(src.path, 0, "unreadable_file", f"{type(e).__name__}: {e}")
        return
    if len(data) > max_bytes:
        errors.add(src.path, 0, "too_large", f">{max_bytes} bytes")
        return
    if not data.strip():
        errors.add(src.path, 0, "empty_file")
        return
    if looks_binary(data):
        errors.add(src.path, 0, "binary_payload")
        return
    text, charset, how = decode_text(data)
    if text is None:
        errors.add(src.path, 0, "undecodable", charset)
        return
    if how != "utf-8":
        errors.skip("charset_detected")
    meta: dict[str, Any] = {"file": src.path, "offset": 0, "charset": charset, "charset_source": how}
    if label is not None:
        meta["label"] = label
    yield Document(id=stable_id(source, src.rel, 0), text=text, source=source, meta=meta)


def _label(rel: str) -> str | None:
    parts = rel.split("/")
    return parts[-2] if len(parts) >= 2 else None


def text_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_text_file(src, source.name, errors, max_doc_bytes, None)


def text_folder_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    label = _label(src.rel) if source.label_from_folder else None
    return read_text_file(src, source.name, errors, max_doc_bytes, label)


text_reader.traits = ReaderTraits(one_doc_per_file=True)  # type: ignore[attr-defined]
text_folder_reader.traits = ReaderTraits(one_doc_per_file=True)  # type: ignore[attr-defined]
