"""The `hf_dataset` reader: a `datasets` `save_to_disk` folder, cut into row ranges for parallel tasks, or data files
read through a streamed `load_dataset`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.document import Document
from data_pipeline.readers.base import ErrorLog, ReaderTraits, SourceFile, doc_from_row, list_source_files

if TYPE_CHECKING:
    from data_pipeline.readers import WorkShard
    from runconfig.data import SourceConfig


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
        ds = _first_split(datasets.load_from_disk(path))
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
        doc = doc_from_row(rec, text_field, src, source, i, errors)
        i += 1
        if doc is not None:
            yield doc


def _plan_hf_dataset(
    source: SourceConfig, docs_per_shard: int
) -> list[tuple[tuple[SourceFile, ...], tuple[int, int] | None]]:
    """A `save_to_disk` folder: row ranges of `docs_per_shard`; data files: one task per file."""
    from core.paths import expand_placeholders

    tasks: list[tuple[tuple[SourceFile, ...], tuple[int, int] | None]] = []
    for raw in source.paths:
        path = expand_placeholders(raw)
        if hf_is_saved(path):
            import datasets

            n = len(_first_split(datasets.load_from_disk(path)))
            rel = path.rstrip("/").rsplit("/", 1)[-1]
            tasks += [
                ((SourceFile(path, rel),), (lo, lo + docs_per_shard))
                for lo in range(0, max(n, 1), docs_per_shard)
            ]
        else:
            tasks += [((f,), None) for f in list_source_files([raw])]
    return tasks


def _first_split(ds):
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        return ds["train"] if "train" in ds else ds[next(iter(ds))]
    return ds


def hf_dataset_reader(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
) -> Iterator[Document]:
    return read_hf_dataset(src.path, src.rel, source.name, source.text_field, errors, shard.rows)


hf_dataset_reader.traits = ReaderTraits(plan=_plan_hf_dataset, paths_are_files=False)  # type: ignore[attr-defined]
