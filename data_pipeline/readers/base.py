"""Shared reader plumbing: where a source's files are, how a bad record is reported, bounded reads."""

from __future__ import annotations

import io
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import fsspec

from data_pipeline.paths import expand_placeholders

# A report that names every bad record can itself become huge on a rotten crawl; past this many per shard
# the records are still counted exactly, only not listed one by one.
MAX_LISTED = 10_000


@dataclass
class BadRecord:
    """One record we could not turn into a document: enough to find it again (file + byte offset)."""

    path: str
    offset: int | None
    kind: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ErrorLog:
    """Collects bad records (named) and benign skips (counted) while a shard is read."""

    bad: list[BadRecord] = field(default_factory=list)
    bad_counts: Counter = field(default_factory=Counter)
    skips: Counter = field(default_factory=Counter)

    def add(self, path: str, offset: int | None, kind: str, detail: str = "") -> None:
        self.bad_counts[kind] += 1
        if len(self.bad) < MAX_LISTED:
            self.bad.append(BadRecord(str(path), offset, kind, detail[:300]))

    def skip(self, kind: str, n: int = 1) -> None:
        self.skips[kind] += n


@dataclass(frozen=True)
class SourceFile:
    path: str  # what fsspec opens
    rel: str  # path relative to the source root: the stable part of a document id


def _glob_root(pattern: str) -> str:
    """The folder a pattern is anchored at: everything before the first glob character."""
    cut = min((i for i, c in enumerate(pattern) if c in "*?["), default=len(pattern))
    head = pattern[:cut]
    return head if head.endswith("/") else head.rsplit("/", 1)[0] + "/" if "/" in head else ""


def list_source_files(paths: list[str]) -> list[SourceFile]:
    """Expand a source's patterns into files, each with its path relative to the pattern's root folder.

    Ids built from the relative path stay the same when the data moves (another prefix, another bucket).
    """
    from data_pipeline.paths import expand_paths

    out: dict[str, SourceFile] = {}
    # Files named one by one share one root: their common folder. Otherwise ".../tech/001.txt" and
    # ".../business/001.txt" would both be "001.txt": one id for two documents, and no folder label.
    explicit = [expand_placeholders(p) for p in paths if not any(c in p for c in "*?[") and "://" not in p
                and not os.path.isdir(expand_placeholders(p))]
    common = os.path.commonpath([os.path.dirname(p) for p in explicit]) + "/" if len(explicit) > 1 else None
    for raw in paths:
        pat = expand_placeholders(raw).rstrip("/") if not raw.endswith("://") else raw
        files = expand_paths([raw], recursive_dirs=True)
        fs, _, _ = fsspec.core.get_fs_token_paths(pat)
        has_glob = any(c in pat for c in "*?[")
        strip = pat.split("://", 1)[1] if "://" in pat else pat
        if has_glob:
            root = _glob_root(strip)
        elif fs.isdir(pat):  # the URL itself: HTTP cannot resolve a path stripped of its scheme
            root = strip.rstrip("/") + "/"
        elif common is not None and pat in explicit:
            root = common
        else:
            root = strip.rsplit("/", 1)[0] + "/" if "/" in strip else ""
        for f in files:
            bare = f.split("://", 1)[1] if "://" in f else f
            if os.sep != "/":
                bare = bare.replace(os.sep, "/")
            rel = bare[len(root) :] if root and bare.startswith(root) else bare.rsplit("/", 1)[-1]
            out.setdefault(f, SourceFile(f, rel.lstrip("/")))
    return sorted(out.values(), key=lambda s: s.path)


def open_binary(path: str) -> IO[bytes]:
    """Raw bytes of a local path or fsspec URL, no decompression (readers choose their own)."""
    f = fsspec.open(path, "rb", compression=None).open()
    if "://" in path and not path.startswith("file://"):
        # Remote fsspec files (s3fs, HTTP) take no size in readline(); buffered, they read like local files.
        return io.BufferedReader(f)
    return f


def open_decompressed(path: str) -> IO[bytes]:
    """Byte stream with .gz / .zst / .bz2 / .xz undone, buffered so readline works on every codec."""
    raw = open_binary(path)
    low = path.lower()
    if low.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    if low.endswith((".zst", ".zstd")):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))
    if low.endswith(".bz2"):
        import bz2

        return bz2.BZ2File(raw)
    if low.endswith(".xz"):
        import lzma

        return lzma.LZMAFile(raw)
    return raw


def read_bounded_line(f: IO[bytes], limit: int) -> tuple[bytes, bool]:
    """One line of at most `limit` bytes; a longer line is consumed in chunks and reported as too long.

    Memory stays bounded by `limit` even for a 50 MB line with no newline.
    """
    line = f.readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line, False
    while True:
        chunk = f.readline(1 << 20)
        if not chunk or chunk.endswith(b"\n"):
            return b"", True


def looks_binary(data: bytes) -> bool:
    """NUL bytes or a high share of control bytes: not text in any charset we would decode."""
    if not data:
        return False
    head = data[:8192]
    if b"\x00" in head:
        return True
    ctrl = sum(1 for b in head if b < 9 or 13 < b < 32)
    return ctrl / len(head) > 0.1


def decode_text(data: bytes) -> tuple[str | None, str, str]:
    """(text, charset, how): UTF-8 when it is valid, else the charset charset-normalizer detects."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8"), "utf-8", "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(data[:200_000]).best()
    if best is None:
        return None, "", "undecodable"
    try:
        return data.decode(best.encoding), best.encoding, "detected"
    except (UnicodeDecodeError, LookupError):
        return None, best.encoding, "undecodable"
