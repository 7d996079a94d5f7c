"""The `jsonl` reader: one JSON object per line, plain or compressed (.gz/.zst/...); an uncompressed file is cut
into line-aligned pieces for parallel tasks (`data.max_task_bytes`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.document import Document
from data_pipeline.readers.base import (
    DECOMP_ERRORS,
    ErrorLog,
    ReaderTraits,
    SourceFile,
    doc_from_row,
    open_decompressed,
    read_bounded_line,
)
from data_pipeline.readers.ranges import open_span, split_lines

if TYPE_CHECKING:
    from data_pipeline.readers import WorkShard
    from runconfig.data import SourceConfig


def read_jsonl(
    src: SourceFile, source: str, text_field: str, errors: ErrorLog, max_bytes: int
) -> Iterator[Document]:
    """One JSON object per line; the byte offset in the decompressed stream identifies the line."""
    offset, last_good = (src.span[0] if src.span else 0), None
    try:
        with open_span(src) if src.span else open_decompressed(src.path) as f:
            while True:
                line, too_long = read_bounded_line(f, max_bytes)
                if too_long:
                    errors.add(src.path, offset, "line_too_long", f">{max_bytes} bytes")
                    offset = f.tell() if hasattr(f, "tell") and _tell_ok(f) else offset
                    continue
                if not line:
                    if offset == 0:
                        errors.add(src.path, 0, "empty_file")
                    return
                here, offset = offset, offset + len(line)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except UnicodeDecodeError as e:
                    errors.add(src.path, here, "invalid_utf8", str(e)[:200])
                    continue
                except ValueError as e:
                    errors.add(src.path, here, "malformed_json", str(e)[:200])
                    continue
                if not isinstance(row, dict):
                    errors.add(src.path, here, "malformed_json", f"top level is {type(row).__name__}")
                    continue
                doc = doc_from_row(row, text_field, src, source, here, errors)
                if doc is not None:
                    last_good = here
                    yield doc
    except EOFError as e:  # the stream ends inside a compressed block: every record after `offset` is lost
        errors.add(
            src.path,
            offset,
            "truncated_stream",
            f"compressed stream cut off; records from this offset on are lost; last good record at offset "
            f"{'none' if last_good is None else last_good} ({e})",
        )
    except DECOMP_ERRORS as e:
        errors.add(src.path, offset, "truncated_or_corrupt_compression", f"{type(e).__name__}: {e}")


def _tell_ok(f) -> bool:
    try:
        f.tell()
        return True
    except (OSError, ValueError):
        return False


def jsonl_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_jsonl(src, source.name, source.text_field, errors, max_doc_bytes)


jsonl_reader.traits = ReaderTraits(split=split_lines)  # type: ignore[attr-defined]
