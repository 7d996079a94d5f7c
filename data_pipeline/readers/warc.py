"""WARC / WET via warcio, resynchronising after a corrupt record so the good records behind it survive."""

from __future__ import annotations

import gzip
import logging
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from warcio.archiveiterator import ArchiveIterator as _WarcioIterator
from warcio.exceptions import ArchiveLoadFailed

from core.document import Document, stable_id
from data_pipeline.readers.base import ErrorLog, ReaderTraits, SourceFile, looks_binary, open_binary
from data_pipeline.readers.ranges import split_warc
from data_pipeline.readers.record_starts import is_gzip_member, next_record_start

if TYPE_CHECKING:
    from data_pipeline.readers import WorkShard
    from runconfig.data import SourceConfig

# warcio writes "Record not followed by newline" straight to sys.stderr, into the progress bar; routed to its
# logger instead, which the CLI sends to the run's log file (core/log.py).
_warcio_log = logging.getLogger("warcio")


class _LoggedNotice(str):
    """warcio's INC_RECORD template: formatting it logs the notice and leaves nothing for sys.stderr.write."""

    def format(self, *args: object, **kwargs: object) -> str:
        _warcio_log.warning(" ".join(str.format(self, *args, **kwargs).split()))
        return ""


class ArchiveIterator(_WarcioIterator):
    """warcio's iterator with its stderr notice sent to the `warcio` logger."""

    INC_RECORD = _LoggedNotice(_WarcioIterator.INC_RECORD)


HTML_TYPES = ("text/html", "application/xhtml+xml", "application/xml+xhtml")


def _read_limited(stream, limit: int) -> bytes:
    """warcio's streams return short reads (one decompressed block), so read until EOF or the limit."""
    parts, total = [], 0
    while total < limit:
        b = stream.read(min(1 << 16, limit - total))
        if not b:
            break
        parts.append(b)
        total += len(b)
    return b"".join(parts)


def _doc_from_record(
    rec, src: SourceFile, source: str, offset: int, wet: bool, errors: ErrorLog, max_bytes: int
) -> Document | None:
    rtype = rec.rec_type
    want = "conversion" if wet else "response"
    if rtype != want:
        errors.skip(f"warc_{rtype}_record")
        return None
    url = rec.rec_headers.get_header("WARC-Target-URI")
    date = rec.rec_headers.get_header("WARC-Date")
    ctype = ""
    if not wet:
        if rec.http_headers is None:
            errors.add(src.path, offset, "missing_http_headers", url or "")
            return None
        status = rec.http_headers.get_statuscode()
        if status and not str(status).startswith("2"):
            errors.skip("http_status_not_2xx")
            return None
        ctype = (rec.http_headers.get_header("Content-Type") or "").strip()
        if not ctype.lower().startswith(HTML_TYPES):
            errors.add(src.path, offset, "non_html_content_type", ctype or "(none)")
            return None
    payload = _read_limited(rec.content_stream(), max_bytes + 1)
    if len(payload) > max_bytes:
        errors.add(src.path, offset, "too_large", f">{max_bytes} bytes")
        return None
    # A record cut short (truncated gzip member, short file) reads "successfully" but leaves part of its
    # declared Content-Length unread: it is damaged, not a short page.
    if getattr(rec.raw_stream, "limit", 0) > 0:
        errors.add(src.path, offset, "truncated_record", f"{rec.raw_stream.limit} bytes missing")
        return None
    if not payload.strip():
        errors.add(src.path, offset, "empty_payload", url or "")
        return None
    if looks_binary(payload):
        errors.add(src.path, offset, "binary_payload", f"{ctype or 'text'} record with binary bytes")
        return None
    doc = Document(
        id=stable_id(source, src.rel, offset),
        url=url,
        timestamp=date,
        source=source,
        meta={"file": src.path, "offset": offset, "content_type": ctype},
    )
    if wet:
        doc.text = payload.decode("utf-8", errors="replace")
    else:
        doc.html = payload
    return doc


class _LostSync(Exception):
    """A record of a .warc.gz file that warcio parsed from raw, undecompressed bytes.

    When a member's first block does not inflate, warcio quietly assumes the data is not compressed and parses
    the compressed bytes as WARC text: a made-up Content-Length then swallows the good members behind it, which
    vanished without a report. In a gzipped WARC every record is its own member, so this record is corrupt and
    reading resumes at the next member (`next_record_start`)."""

    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset


class _Held:
    """A record's document is handed out only once warcio has moved past the record: a Content-Length smaller
    than the payload shows only then (the next record does not start where this one declared its end: warcio
    counts it in `err_count`), and so does a WARC digest mismatch (checked when the record is read to its end).
    Either way the payload is cut and the record is reported, never kept."""

    def __init__(self, src: SourceFile, errors: ErrorLog):
        self.src, self.errors, self.item = src, errors, None

    def hold(self, doc: Document, rec, offset: int, it) -> None:
        self.item = (doc, rec, offset, it.err_count)

    def release(self, it) -> Iterator[Document]:
        if self.item is None:
            return
        doc, rec, offset, errs = self.item
        self.item = None
        checker = getattr(rec, "digest_checker", None)
        if it.err_count > errs:
            self.errors.add(
                self.src.path,
                offset,
                "truncated_record",
                "Content-Length ends before the payload does: the next record does not start where "
                "this one declares its end",
            )
        elif checker is not None and checker.passed is False:
            self.errors.add(
                self.src.path,
                offset,
                "truncated_record",
                "WARC digest mismatch: " + "; ".join(map(str, checker.problems))[:200],
            )
        else:
            yield doc


def read_warc(
    src: SourceFile, source: str, errors: ErrorLog, max_bytes: int, wet: bool = False
) -> Iterator[Document]:
    """Response (WARC) or conversion (WET) records of one file, as documents with offsets for their ids."""
    with open_binary(src.path) as fh:
        if not fh.read(1):
            errors.add(src.path, 0, "empty_file")
            return
        gz = is_gzip_member(fh, 0)
        pos, end = src.span if src.span else (0, float("inf"))  # a piece: records starting in [pos, end)
        while True:
            fh.seek(pos)
            it = ArchiveIterator(fh, arc2warc=True, check_digests=True)
            offset = pos
            first = True
            held = _Held(src, errors)
            try:
                for rec in it:
                    yield from held.release(it)
                    offset = pos if first else it.offset  # not get_record_offset(): it consumes the record
                    first = False
                    if offset >= end:
                        return
                    if gz and it.reader.decompressor is None:
                        raise _LostSync(offset)
                    doc = _doc_from_record(rec, src, source, offset, wet, errors, max_bytes)
                    if doc is not None:
                        held.hold(doc, rec, offset, it)
                yield from held.release(it)
                if first and pos == 0:  # e.g. a 1-byte .warc.gz: warcio ends quietly without a single record
                    fh.seek(0, 2)
                    errors.add(
                        src.path, 0, "truncated_or_corrupt_file", f"{fh.tell()} bytes and no WARC record"
                    )
                return
            except ArchiveLoadFailed as e:
                if "non-chunked gzip" in str(e) and pos == 0:
                    held.item = None  # the sequential read below starts over, this record included
                    # One gzip stream around the whole file (not per record): still valid data, read it
                    # sequentially through gzip; offsets then refer to the decompressed stream.
                    errors.skip("warc_non_chunked_gzip_file")
                    yield from _read_sequential(src, source, errors, max_bytes, wet)
                    return
                yield from held.release(it)
                bad_at = it.offset if not first else offset
                errors.add(src.path, bad_at, "corrupt_warc_record", str(e).strip().splitlines()[0][:200])
            except _LostSync as e:
                yield from held.release(it)
                bad_at = e.offset
                errors.add(
                    src.path,
                    bad_at,
                    "corrupt_warc_record",
                    "gzip member does not decompress (read as raw bytes, it would swallow the records behind it)",
                )
            except (EOFError, zlib.error, OSError, ValueError, IndexError) as e:
                yield from held.release(it)
                bad_at = it.offset if not first else offset
                kind = "truncated_gzip" if isinstance(e, EOFError | zlib.error) else "corrupt_warc_record"
                errors.add(src.path, bad_at, kind, f"{type(e).__name__}: {e}")
            nxt = next_record_start(fh, max(bad_at, pos) + 1, gz)
            if nxt is None or nxt >= end:
                return
            pos = nxt


def _read_sequential(
    src: SourceFile, source: str, errors: ErrorLog, max_bytes: int, wet: bool
) -> Iterator[Document]:
    with open_binary(src.path) as raw, gzip.GzipFile(fileobj=raw) as fh:
        it = ArchiveIterator(fh, arc2warc=True)
        offset = 0
        try:
            for rec in it:
                offset = it.offset
                doc = _doc_from_record(rec, src, source, offset, wet, errors, max_bytes)
                if doc is not None:
                    yield doc
        except (ArchiveLoadFailed, EOFError, zlib.error, OSError, ValueError) as e:
            errors.add(src.path, offset, "corrupt_warc_record", f"{type(e).__name__}: {e}"[:200])


def warc_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_warc(src, source.name, errors, max_doc_bytes)


def wet_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_warc(src, source.name, errors, max_doc_bytes, wet=True)


# A file is cut at record starts (gzip members or WARC/ lines), compressed or not: both formats alike.
warc_reader.traits = wet_reader.traits = ReaderTraits(split=split_warc, splits_compressed=True)  # type: ignore[attr-defined]
