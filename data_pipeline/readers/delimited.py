"""The `csv` and `tsv` readers: a table with a header row, one document per data row."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.document import Document
from data_pipeline.readers.base import DECOMP_ERRORS, ErrorLog, SourceFile, doc_from_row, open_decompressed

if TYPE_CHECKING:
    from data_pipeline.readers import WorkShard
    from runconfig.data import SourceConfig


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
                doc = doc_from_row(row, text_field, src, source, here, errors)
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
    except DECOMP_ERRORS as e:
        errors.add(src.path, row_no, "truncated_or_corrupt_compression", f"{type(e).__name__}: {e}")


def csv_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_csv(src, source.name, source.text_field, errors, max_doc_bytes)


def tsv_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_csv(src, source.name, source.text_field, errors, max_doc_bytes, delimiter="\t")
