"""Shared reader plumbing: where a source's files are, how a bad record is reported, bounded reads, a table row as
a Document."""

from __future__ import annotations

import io
import os
import signal
import stat
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import fsspec

from core.document import Document, stable_id
from core.paths import expand_placeholders
from core.registry import READERS

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
    # A piece of a large file (readers/ranges.py): byte range, or row groups for Parquet. None: the whole file.
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class ReaderTraits:
    """What the shard planner and the preflight need to know about a format, declared on its reader (a reader
    function's `traits` attribute; a reader without one gets the defaults: one task per file, paths are files).
    A format is then one reader plus its traits, and no planner code names a format (datatrove's readers: a
    format is one small subclass)."""

    # Each file is one document (plain text): the planner groups `docs_per_shard` files into one task.
    one_doc_per_file: bool = False
    # Record-aligned pieces of a file above `data.max_task_bytes`: (file, max bytes) -> pieces (ranges.py:
    # split_lines, split_warc, split_parquet). None: a file is never split.
    split: Callable[[SourceFile, int], list[SourceFile]] | None = None
    # A compressed file (.gz/.zst/...) can be entered mid-stream by `split` (WARC's gzip members); False: a
    # compressed file stays one task.
    splits_compressed: bool = False
    # The format plans its own tasks from the source: (source, docs_per_shard) -> [(files, row range)] (a saved
    # HF dataset: row ranges). None: the planner lists the source's files.
    plan: Callable[[Any, int], list[tuple[tuple[SourceFile, ...], tuple[int, int] | None]]] | None = None
    # `paths:` name files that must exist before a stage starts (False: names a Hub dataset may resolve).
    paths_are_files: bool = True


DEFAULT_TRAITS = ReaderTraits()


def reader_traits(reader: Any) -> ReaderTraits:
    """The traits a reader declares, or the defaults."""
    traits = getattr(reader, "traits", None)
    return traits if isinstance(traits, ReaderTraits) else DEFAULT_TRAITS


def format_traits(fmt: str) -> ReaderTraits:
    """The traits of the reader registered for `fmt` (a source's `format`): what the planner, the file splitter
    and the path check read, looked up here so that the modules beside the readers need not import the package
    that imports them."""
    return reader_traits(READERS.get(fmt))


def _glob_root(pattern: str) -> str:
    """The folder a pattern is anchored at: everything before the first glob character."""
    cut = min((i for i, c in enumerate(pattern) if c in "*?["), default=len(pattern))
    head = pattern[:cut]
    return head if head.endswith("/") else head.rsplit("/", 1)[0] + "/" if "/" in head else ""


def list_source_files(paths: list[str]) -> list[SourceFile]:
    """Expand a source's patterns into files, each with its path relative to the pattern's root folder.

    Ids built from the relative path stay the same when the data moves (another prefix, another bucket).
    """
    from core.paths import expand_paths

    out: dict[str, SourceFile] = {}
    # Files named one by one share one root: their common folder. Otherwise ".../tech/001.txt" and
    # ".../business/001.txt" would both be "001.txt": one id for two documents, and no folder label.
    explicit = [
        expand_placeholders(p)
        for p in paths
        if not any(c in p for c in "*?[") and "://" not in p and not os.path.isdir(expand_placeholders(p))
    ]
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


_SPECIAL = (
    (stat.S_ISFIFO, "named pipe"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def special_file_kind(path: str) -> str | None:
    """What a local path is when it is not a regular file (reading a named pipe blocks forever), else None."""
    if "://" in path and not path.startswith("file://"):
        return None
    try:
        mode = os.stat(path.removeprefix("file://")).st_mode
    except OSError:
        return None  # missing or unreadable: the reader reports it
    return next((name for test, name in _SPECIAL if test(mode)), None)


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
        return io.BufferedReader(_StrictZstdReader(raw))
    if low.endswith(".bz2"):
        import bz2

        return bz2.BZ2File(raw)
    if low.endswith(".xz"):
        import lzma

        return lzma.LZMAFile(raw)
    return raw


class _StrictZstdReader(io.RawIOBase):
    """Zstandard frames one after another, raising EOFError when the input ends inside a frame.

    zstandard's stream_reader ends quietly at a cut (a .jsonl.zst cut in half kept 9 of 20 records and reported
    nothing); gzip, bz2 and lzma raise EOFError there, and so does this reader.
    """

    def __init__(self, raw: IO[bytes]):
        import zstandard

        self._raw, self._zstd = raw, zstandard.ZstdDecompressor()
        self._dobj = self._zstd.decompressobj()
        self._fed = False  # bytes of the current frame were fed
        self._out = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._out:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                if self._fed and not self._dobj.eof:
                    raise EOFError("zstd stream ended inside a frame (truncated file)")
                return 0
            while chunk:
                self._fed = True
                self._out += self._dobj.decompress(chunk)
                chunk = b""
                if self._dobj.eof:  # next frame: the rest of this chunk belongs to it
                    chunk = self._dobj.unused_data
                    self._dobj, self._fed = self._zstd.decompressobj(), False
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


class ReadStalled(Exception):
    """No data arrived within the read timeout (a hung NFS/FUSE mount, a remote store that stopped answering)."""


@contextmanager
def alarm_after(seconds: float, make_error: Callable[[], BaseException]):
    """Raise `make_error()` in the block after `seconds` (SIGALRM: main thread of a process only, elsewhere no
    limit). A handler that raises interrupts a blocking call (PEP 475), so a stalled read or a pathological page
    cannot hang a shard. The one SIGALRM helper of the data stages (reads here, extraction in extract.py).

    The error is raised where the signal lands, which may be inside a library's `except Exception` (warcio's
    inflate treats any error there as the end of the data, trafilatura returns no text): a deadline that fired
    is therefore raised again when the block ends normally, so a timeout is never silently eaten."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def _raise(signum, frame):
        nonlocal fired
        fired = True
        raise make_error()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            signal.signal(signal.SIGALRM, old)
        # an alarm still pending ran our handler first: restore the old one all the same
        except BaseException:
            signal.signal(signal.SIGALRM, old)
            raise
    if fired:
        raise make_error()


def read_deadline(seconds: float):
    """Raise ReadStalled in the block after `seconds` of no progress."""
    return alarm_after(seconds, lambda: ReadStalled(f"no data for {seconds:g} s"))


def guarded(docs: Iterator[Any], seconds: float) -> Iterator[Any]:
    """The reader's iterator with a deadline on each step (between two documents): only reading is timed,
    never the caller's work on a document."""
    while True:
        with read_deadline(seconds):
            try:
                doc = next(docs)
            except StopIteration:
                return
        yield doc


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


# Longest first: the UTF-32-LE BOM begins with the UTF-16-LE one.
_BOMS = (
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xfe\xff", "utf-16-be"),
    (b"\xff\xfe", "utf-16-le"),
)


def decode_bom(data: bytes) -> tuple[str, str] | None:
    """(text, charset) when the bytes start with a Unicode BOM and decode in its charset, else None. UTF-16/32
    text is full of NUL bytes and used to be dropped as binary."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom) :].decode(codec), codec
            except UnicodeDecodeError:
                return None
    return None


def looks_binary(data: bytes) -> bool:
    """NUL bytes or a high share of control bytes: not text in any charset we would decode."""
    if not data or data.startswith(tuple(bom for bom, codec in _BOMS if codec != "utf-8")):
        return False  # UTF-16/32 text: decode_text decides whether it really decodes
    head = data[:8192]
    if b"\x00" in head:
        return True
    ctrl = sum(1 for b in head if b < 9 or 13 < b < 32)
    return ctrl / len(head) > 0.1


def decode_text(data: bytes) -> tuple[str | None, str, str]:
    """(text, charset, how): a BOM's charset first, UTF-8 when it is valid, else what charset-normalizer
    detects."""
    bom = decode_bom(data)
    if bom is not None:
        return bom[0], bom[1], "bom"
    if data.startswith(tuple(b for b, c in _BOMS if c != "utf-8")):
        return None, next(c for b, c in _BOMS if data.startswith(b)), "undecodable"  # invalid UTF-16/32
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


# What a damaged compressed stream raises (zstandard has its own error type on a damaged frame).
DECOMP_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, OSError)
try:
    import zstandard

    DECOMP_ERRORS = (*DECOMP_ERRORS, zstandard.ZstdError)
except ImportError:  # pragma: no cover
    pass


def _as_str(v: Any) -> str | None:
    return None if v is None else str(v)


def doc_from_row(
    row: dict, text_field: str, src: SourceFile, source: str, offset: int, errors: ErrorLog
) -> Document | None:
    """A record of a table-like format (JSONL, CSV, Parquet, HF datasets) as a Document; a row without the text
    field is a named skip."""
    text = row.get(text_field)
    if not isinstance(text, str):
        errors.add(src.path, offset, "missing_text_field", f"no string field '{text_field}'")
        return None
    meta: dict[str, Any] = {"file": src.path, "offset": offset}
    if row.get("label") is not None:
        meta["label"] = row["label"]
    return Document(
        id=stable_id(source, src.rel, offset),
        text=text,
        url=_as_str(row.get("url")),
        timestamp=_as_str(row.get("timestamp") or row.get("date")),
        source=source,
        meta=meta,
    )
