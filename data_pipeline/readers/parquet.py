"""The `parquet` reader: row groups streamed in batches, cut by row group for parallel tasks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.document import Document
from data_pipeline.readers.base import ErrorLog, ReaderTraits, SourceFile, doc_from_row, open_binary
from data_pipeline.readers.ranges import split_parquet

if TYPE_CHECKING:
    from data_pipeline.readers import WorkShard
    from runconfig.data import SourceConfig


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
                    doc = doc_from_row(rec, text_field, src, source, row, errors)
                    row += 1
                    if doc is not None:
                        yield doc
    except (pa.ArrowException, OSError, ValueError) as e:
        errors.add(src.path, row, "corrupt_parquet", f"{type(e).__name__}: {e}"[:300])


def parquet_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_parquet(src, source.name, source.text_field, errors)


parquet_reader.traits = ReaderTraits(split=split_parquet, splits_compressed=True)  # type: ignore[attr-defined]
