"""JSONL(.gz/.zst), CSV/TSV, Parquet, plain text / text folders and Hugging Face `datasets` sources."""

from __future__ import annotations

import csv
import io
import json
import zlib
from collections.abc import Iterator
from typing import Any

from core.document import Document, stable_id
from data_pipeline.readers.base import (
    ErrorLog,
    SourceFile,
    decode_text,
    looks_binary,
    open_binary,
    open_decompressed,
    read_bounded_line,
)
from data_pipeline.readers.ranges import open_span

_DECOMP_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, OSError)
try:  # zstandard raises its own error type on a damaged frame
    import zstandard

    _DECOMP_ERRORS = (*_DECOMP_ERRORS, zstandard.ZstdError)
except ImportError:  # pragma: no cover
    pass


def _as_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _doc_from_row(
    row: dict, text_field: str, src: SourceFile, source: str, offset: int, errors: ErrorLog
) -> Document | None:
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
                doc = _doc_from_row(row, text_field, src, source, here, errors)
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
    except _DECOMP_ERRORS as e:
        errors.add(src.path, offset, "truncated_or_corrupt_compression", f"{type(e).__name__}: {e}")


def _tell_ok(f) -> bool:
    try:
        f.tell()
        return True
    except (OSError, ValueError):
        return False


def read_csv(
    src: SourceFile,
    source: str,
    text_field: str,
    errors: ErrorLog,
    max_bytes: int,
    delimiter: str | None = None,
) -> Iterator[Document]:
    """A CSV/TSV file with a header row (review, survey and ticket dumps ship this way). Quoted fields may span
    lines; a UTF-8 BOM is dropped; the delimiter is a tab for .tsv/.tab, else a comma, unless given. The data
    row number (0 = the first row after the header) identifies the record. A file without the `text_field`
    column is reported by name once; a row with an empty text cell is a named skip. A damaged row (or a stream
    that cannot be decoded) ends the file with a report: CSV quoting cannot be resynchronised reliably."""
    bare = src.path.lower()
    for ext in (".gz", ".zst", ".zstd", ".bz2", ".xz"):
        bare = bare.removesuffix(ext)
    sep = delimiter or ("\t" if bare.endswith((".tsv", ".tab")) else ",")
    csv.field_size_limit(max(max_bytes, 1 << 17))
    row_no = 0
    try:
        with open_decompressed(src.path) as raw:
            reader = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8-sig", newline=""), delimiter=sep)
            header = reader.fieldnames
            if not header:
                errors.add(src.path, 0, "empty_file")
                return
            if text_field not in header:
                errors.add(
                    src.path, 0, "missing_text_column", f"no column '{text_field}' in the header {header}"
                )
                return
            for row in reader:
                here, row_no = row_no, row_no + 1
                if not row.get(text_field):
                    errors.add(src.path, here, "missing_text_field", f"row {here}: empty '{text_field}'")
                    continue
                doc = _doc_from_row(row, text_field, src, source, here, errors)
                if doc is not None:
                    yield doc
    except csv.Error as e:
        errors.add(src.path, row_no, "malformed_csv", f"row {row_no}: {e}; the rest of this file is skipped")
    except UnicodeDecodeError as e:
        errors.add(src.path, row_no, "invalid_utf8", f"after row {row_no}: {e}"[:300])
    except EOFError as e:
        errors.add(
            src.path,
            row_no,
            "truncated_stream",
            f"compressed stream cut off after data row {row_no}; the rows after it are lost ({e})",
        )
    except _DECOMP_ERRORS as e:
        errors.add(src.path, row_no, "truncated_or_corrupt_compression", f"{type(e).__name__}: {e}")


def read_parquet(src: SourceFile, source: str, text_field: str, errors: ErrorLog) -> Iterator[Document]:
    """Row groups streamed in batches; the row index identifies the record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = 0
    try:
        with open_binary(src.path) as fh:
            pf = pq.ParquetFile(fh)
            groups = range(*src.span) if src.span else range(pf.metadata.num_row_groups)
            # ids count from the file
            row = sum(pf.metadata.row_group(g).num_rows for g in range(groups.start))
            for batch in pf.iter_batches(batch_size=1024, row_groups=list(groups)):
                for rec in batch.to_pylist():
                    doc = _doc_from_row(rec, text_field, src, source, row, errors)
                    row += 1
                    if doc is not None:
                        yield doc
    except (pa.ArrowException, OSError, ValueError) as e:
        errors.add(src.path, row, "corrupt_parquet", f"{type(e).__name__}: {e}"[:300])


def read_text_file(
    src: SourceFile, source: str, errors: ErrorLog, max_bytes: int, label: str | None = None
) -> Iterator[Document]:
    """A whole file is one document (news article, book); charset: UTF-8, else detected and recorded."""
    try:
        with open_decompressed(src.path) as f:
            data = f.read(max_bytes + 1)
    except _DECOMP_ERRORS as e:  # includes PermissionError, IsADirectoryError, broken symlinks
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


def hf_is_saved(path: str) -> bool:
    import fsspec

    fs, _, (p,) = fsspec.core.get_fs_token_paths(path)
    return fs.isdir(p) and (fs.exists(f"{p}/state.json") or fs.exists(f"{p}/dataset_dict.json"))


def read_hf_dataset(
    path: str, rel: str, source: str, text_field: str, errors: ErrorLog, rows: tuple[int, int] | None = None
) -> Iterator[Document]:
    """A `save_to_disk` folder (row range for sharding) or local data files via streamed `load_dataset`."""
    import datasets

    if hf_is_saved(path):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else ds[next(iter(ds))]
        lo, hi = rows if rows is not None else (0, len(ds))
        part = ds.select(range(lo, min(hi, len(ds))))
        it: Iterator[dict] = iter(part)
        start = lo
    else:
        low = path.lower()
        builder = (
            "parquet"
            if low.endswith(".parquet")
            else "csv"
            if low.endswith(".csv")
            else "text"
            if low.endswith(".txt")
            else "json"
        )
        it = iter(datasets.load_dataset(builder, data_files=[path], split="train", streaming=True))
        start = 0
    src = SourceFile(path, rel)
    i = start
    while True:
        try:
            rec = next(it)
        except StopIteration:
            return
        except Exception as e:  # datasets wraps parser errors in many types; name the file and row, move on
            errors.add(path, i, "unreadable_dataset", f"{type(e).__name__}: {e}"[:300])
            return
        doc = _doc_from_row(rec, text_field, src, source, i, errors)
        i += 1
        if doc is not None:
            yield doc
