"""One reader per input format behind one call: `read_source(source_cfg) -> Iterator[Document]`.

Work is planned in shards (`plan_source_shards`) so the clean stage can run them in parallel or as a Slurm
array; `read_shard_docs` reads one shard. Bad records never raise: they go to an `ErrorLog` with file + offset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from core.document import Document
from core.registry import READERS
from data_pipeline.readers.base import (
    BadRecord,
    ErrorLog,
    ReaderTraits,
    ReadStalled,
    SourceFile,
    guarded,
    list_source_files,
    reader_traits,
    special_file_kind,
)
from data_pipeline.readers.formats import (
    hf_is_saved,
    read_csv,
    read_hf_dataset,
    read_jsonl,
    read_parquet,
    read_text_file,
)
from data_pipeline.readers.ranges import split_file, split_lines, split_parquet, split_warc
from data_pipeline.readers.warc import read_warc
from runconfig.data import SourceConfig

__all__ = [
    "BUILTIN_READERS",
    "READERS",
    "BadRecord",
    "ErrorLog",
    "ReaderTraits",
    "SourceFile",
    "WorkShard",
    "get_reader",
    "list_source_files",
    "plan_source_shards",
    "read_shard_docs",
    "read_source",
    "reader_traits",
    "register_reader",
]

DEFAULT_MAX_DOC_BYTES = 10_000_000
DEFAULT_READ_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WorkShard:
    """The unit of cleaning work: some files of one source (or a row range of one saved HF dataset)."""

    source: str
    index: int  # within the source: names the output shard
    files: tuple[SourceFile, ...]
    rows: tuple[int, int] | None = None


def _label(rel: str) -> str | None:
    parts = rel.split("/")
    return parts[-2] if len(parts) >= 2 else None


def plan_source_shards(
    source: SourceConfig, docs_per_shard: int, max_task_bytes: int | None = None
) -> list[WorkShard]:
    """Split a source into shards as its reader's traits say: the reader's own plan (row ranges of a saved HF
    dataset), `docs_per_shard` files per shard for one-document-per-file formats (text), else one per file, or
    per record-aligned piece of a file larger than `max_task_bytes` for a reader that can split (ranges.py)."""
    traits = reader_traits(get_reader(source.format))
    if traits.plan is not None:
        return [
            WorkShard(source.name, i, files, rows)
            for i, (files, rows) in enumerate(traits.plan(source, docs_per_shard))
        ]
    files = list_source_files(source.paths)
    if traits.one_doc_per_file:
        return [
            WorkShard(source.name, i, tuple(files[lo : lo + docs_per_shard]))
            for i, lo in enumerate(range(0, len(files), docs_per_shard))
        ]
    pieces = [p for f in files for p in split_file(f, source.format, max_task_bytes)]
    return [WorkShard(source.name, i, (f,)) for i, f in enumerate(pieces)]


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


# -- readers by name ---------------------------------------------------------------------------------------
# A reader turns one file of a work shard into Documents: (source, shard, file, errors, max_doc_bytes) ->
# Iterator[Document]; bad records go to `errors`, never raise. Outside packages add formats through the
# `lmstack.readers` entry point group (the config accepts their names), so CLI, process pool and Slurm array
# tasks all find them.
Reader = Callable[[SourceConfig, WorkShard, SourceFile, ErrorLog, int], Iterator[Document]]


def get_reader(name: str) -> Reader:
    return READERS.get(name)


def register_reader(name: str, reader: Reader, traits: ReaderTraits | None = None) -> None:
    """Registers a reader; `traits` (or the reader's own `traits` attribute) tell the planner how to cut it."""
    if traits is not None:
        reader.traits = traits  # type: ignore[attr-defined]
    READERS.register(name, reader)


def _text(source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int):
    return read_text_file(src, source.name, errors, max_doc_bytes, None)


def _text_folder(
    source: SourceConfig, shard: WorkShard, src: SourceFile, errors: ErrorLog, max_doc_bytes: int
):
    label = _label(src.rel) if source.label_from_folder else None
    return read_text_file(src, source.name, errors, max_doc_bytes, label)


_LINES = ReaderTraits(split=split_lines)
_WARC = ReaderTraits(split=split_warc, splits_compressed=True)
register_reader(
    "warc", lambda source, shard, src, errors, mdb: read_warc(src, source.name, errors, mdb), _WARC
)
register_reader("wet", lambda source, shard, src, errors, mdb: read_warc(src, source.name, errors, mdb, wet=True),
                _WARC)  # fmt: skip
register_reader("jsonl", lambda source, shard, src, errors, mdb: read_jsonl(src, source.name, source.text_field,
                                                                             errors, mdb), _LINES)  # fmt: skip
register_reader("csv", lambda source, shard, src, errors, mdb: read_csv(src, source.name, source.text_field,
                                                                         errors, mdb))  # fmt: skip
register_reader("tsv", lambda source, shard, src, errors, mdb: read_csv(src, source.name, source.text_field,
                                                                         errors, mdb, delimiter="\t"))  # fmt: skip
register_reader("parquet", lambda source, shard, src, errors, mdb: read_parquet(src, source.name, source.text_field,
                                                                                 errors),
                ReaderTraits(split=split_parquet, splits_compressed=True))  # fmt: skip
register_reader("text", _text, ReaderTraits(one_doc_per_file=True))
register_reader("text_folder", _text_folder, ReaderTraits(one_doc_per_file=True))
register_reader("hf_dataset", lambda source, shard, src, errors, mdb: read_hf_dataset(
    src.path, src.rel, source.name, source.text_field, errors, shard.rows),
    ReaderTraits(plan=_plan_hf_dataset, paths_are_files=False))  # fmt: skip
# Versioned with lmstack itself; a plug-in reader's code goes into the clean stage's fingerprint.
BUILTIN_READERS = frozenset(READERS)


def read_shard_docs(
    source: SourceConfig,
    shard: WorkShard,
    errors: ErrorLog,
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
) -> Iterator[Document]:
    """Documents of one work shard, in a deterministic order. HTML stays in `doc.html` (see extract.py).
    Non-regular files (named pipes, sockets, devices) are skipped and reported; a file whose read stalls for
    `read_timeout_s` is reported and the shard moves on."""
    reader = get_reader(source.format)
    for src in shard.files:
        last = None
        try:
            for doc in guarded(_read_file(reader, source, shard, src, errors, max_doc_bytes), read_timeout_s):
                last = doc.meta.get("offset", last)
                yield doc
        except ReadStalled as e:
            after = f" after the record at offset {last}" if last is not None else ""
            errors.add(src.path, None, "read_timeout", f"{e}: the rest of this file{after} is skipped")


def _read_file(
    reader: Reader,
    source: SourceConfig,
    shard: WorkShard,
    src: SourceFile,
    errors: ErrorLog,
    max_doc_bytes: int,
) -> Iterator[Document]:
    """One file's documents through its registered reader; a bad record never raises (it goes to `errors`)."""
    special = special_file_kind(src.path)
    if special is not None:
        errors.add(src.path, 0, "not_a_regular_file", f"{special}: skipped (reading it could block forever)")
        return
    try:
        yield from reader(source, shard, src, errors, max_doc_bytes)
    except (OSError, EOFError) as e:
        # A file that cannot even be opened (permissions, a directory, a dangling link, a dead URL).
        errors.add(src.path, 0, "unreadable_file", f"{type(e).__name__}: {e}")


def read_source(
    source: SourceConfig, errors: ErrorLog | None = None, max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES
) -> Iterator[Document]:
    """Every document of a source, raw (not cleaned, holdout included): what fine-tuning reads.

    text_folder sources carry the sub-folder name in `doc.meta["label"]`; ids are stable
    (source name + path relative to the source root + record offset).
    """
    errors = errors if errors is not None else ErrorLog()
    for shard in plan_source_shards(source, docs_per_shard=10_000):
        yield from read_shard_docs(source, shard, errors, max_doc_bytes)
