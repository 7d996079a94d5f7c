"""Where WARC records start in a file: the scan the WARC reader resynchronises with after a corrupt record and
the splitter (ranges.py) cuts large files at. No warcio here: finding a cut reads a few KB."""

from __future__ import annotations

import zlib

_GZ_MAGIC = b"\x1f\x8b\x08"
_SCAN = 1 << 20


def is_gzip_member(fh, pos: int) -> bool:
    """A gzip member starts at `pos` (each record of a .warc.gz is its own member)."""
    fh.seek(pos)
    return fh.read(3) == _GZ_MAGIC


def next_record_start(fh, start: int, gz: bool) -> int | None:
    """Next offset >= start where a readable record begins (a gzip member holding WARC/, or a WARC/ line).

    warcio stops at the first broken record; a crawl file with one damaged member in the middle would lose
    everything behind it, so we scan forward ourselves (warcio has no resync).
    """
    needle = _GZ_MAGIC if gz else b"WARC/1."
    pos = start
    while True:
        fh.seek(pos)
        buf = fh.read(_SCAN + len(needle))
        if not buf:
            return None
        i = buf.find(needle)
        while i != -1:
            cand = pos + i
            if not gz:
                if cand == 0 or buf[i - 1 : i] == b"\n" or i == 0:
                    return cand
            else:
                fh.seek(cand)
                try:
                    head = zlib.decompressobj(31).decompress(fh.read(4096), 16)
                except zlib.error:
                    head = b""
                if head.startswith(b"WARC/"):
                    return cand
            i = buf.find(needle, i + 1)
        if len(buf) < _SCAN + len(needle):
            return None
        pos += _SCAN
