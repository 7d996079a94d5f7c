"""Split a large input file into record-aligned pieces, each its own task (`data.max_task_bytes`).

One 50 GB JSONL or WARC file would otherwise be one task that serialises its whole stage. A piece is a
`SourceFile` with `span` set:

- JSONL (uncompressed): byte range [start, end); both ends sit just after a newline, so every line belongs to
  exactly one piece. Compressed JSONL (.gz/.zst/...) cannot be entered mid-stream and stays one task.
- WARC / WET: byte range [start, end) whose ends are record starts (a gzip member holding `WARC/`, or a
  `WARC/1.x` line in an uncompressed file), found with the reader's own resync scan. A file that is one gzip
  stream around everything has no such points and stays one task.
- Parquet: row groups [first, last) (the format's own unit of independent reading).

Offsets stay relative to the whole file, so document ids are the same whether a file is split or not. Finding
the cut points reads a few KB per cut, never the file.
"""

from __future__ import annotations

import dataclasses
import io
from typing import IO

from data_pipeline.readers.base import SourceFile, format_traits, open_binary
from data_pipeline.readers.record_starts import is_gzip_member, next_record_start

_COMPRESSED = (".gz", ".zst", ".zstd", ".bz2", ".xz")


def _size(path: str) -> int:
    import fsspec

    fs, bare = fsspec.core.url_to_fs(path)
    return int(fs.info(bare)["size"])


def _jsonl_cuts(fh, size: int, step: int) -> list[int]:
    cuts = [0]
    for target in range(step, size, step):
        if target <= cuts[-1]:
            continue
        fh.seek(target - 1)
        fh.readline()  # the rest of the line holding byte target-1: the next line starts a piece
        pos = fh.tell()
        if pos < size and pos > cuts[-1]:
            cuts.append(pos)
    return cuts + [size]


def _warc_cuts(fh, size: int, step: int) -> list[int]:
    gz = is_gzip_member(fh, 0)
    cuts = [0]
    for target in range(step, size, step):
        if target <= cuts[-1]:
            continue
        pos = next_record_start(fh, target, gz)
        if pos is None:
            break
        if pos > cuts[-1]:
            cuts.append(pos)
    return cuts + [size]


def split_file(src: SourceFile, fmt: str, max_bytes: int | None) -> list[SourceFile]:
    """`src` as record-aligned pieces of about `max_bytes` each (just `[src]` when it is small or its format's
    reader declares no `split` trait, or it is compressed and the reader cannot enter a compressed stream)."""
    traits = format_traits(fmt)
    if not max_bytes or traits.split is None:
        return [src]
    if not traits.splits_compressed and src.path.lower().endswith(_COMPRESSED):
        return [src]
    try:
        size = _size(src.path)
    except (OSError, ValueError):
        return [src]  # the reader reports an unreadable file by name
    if size <= max_bytes:
        return [src]
    return traits.split(src, max_bytes)


def _byte_pieces(src: SourceFile, max_bytes: int, cutter) -> list[SourceFile]:
    size = _size(src.path)
    with open_binary(src.path) as fh:
        cuts = cutter(fh, size, max_bytes)
    if len(cuts) <= 2:
        return [src]
    return [dataclasses.replace(src, span=(a, b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def split_lines(src: SourceFile, max_bytes: int) -> list[SourceFile]:
    """Byte ranges that start just after a newline (JSONL, or any one-record-per-line format)."""
    return _byte_pieces(src, max_bytes, _jsonl_cuts)


def split_warc(src: SourceFile, max_bytes: int) -> list[SourceFile]:
    """Byte ranges that start at a WARC record (a gzip member holding `WARC/`, or a `WARC/1.x` line)."""
    return _byte_pieces(src, max_bytes, _warc_cuts)


def split_parquet(src: SourceFile, max_bytes: int) -> list[SourceFile]:
    """Row-group ranges of about `max_bytes` (uncompressed) each."""
    return _parquet_pieces(src, max_bytes)


def _parquet_pieces(src: SourceFile, max_bytes: int) -> list[SourceFile]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with open_binary(src.path) as fh:
            meta = pq.ParquetFile(fh).metadata
    except (pa.ArrowException, OSError, ValueError):
        return [src]
    pieces, first, acc = [], 0, 0
    for g in range(meta.num_row_groups):
        acc += meta.row_group(g).total_byte_size
        if acc >= max_bytes:
            pieces.append((first, g + 1))
            first, acc = g + 1, 0
    if first < meta.num_row_groups:
        pieces.append((first, meta.num_row_groups))
    if len(pieces) <= 1:
        return [src]
    return [dataclasses.replace(src, span=p) for p in pieces]


class _Limited(io.RawIOBase):
    """The bytes [start, end) of a file, as a stream (readline and tell keep working; tell is absolute)."""

    def __init__(self, fh: IO[bytes], start: int, end: int):
        self.fh, self.end = fh, end
        fh.seek(start)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        left = self.end - self.fh.tell()
        if left <= 0:
            return 0
        data = self.fh.read(min(len(b), left))
        b[: len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self.fh.tell()

    def close(self) -> None:
        self.fh.close()
        super().close()


def open_span(src: SourceFile) -> IO[bytes]:
    """A JSONL piece's bytes (readline works; reading stops at the piece's end)."""
    assert src.span is not None
    return io.BufferedReader(_Limited(open_binary(src.path), *src.span))
