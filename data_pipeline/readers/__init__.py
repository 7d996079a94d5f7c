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
    format_traits,
    guarded,
    list_source_files,
    reader_traits,
    special_file_kind,
)
from data_pipeline.readers.ranges import split_file
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


def plan_source_shards(
    source: SourceConfig, docs_per_shard: int, max_task_bytes: int | None = None
) -> list[WorkShard]:
    """Split a source into shards as its reader's traits say: the reader's own plan (row ranges of a saved HF
    dataset), `docs_per_shard` files per shard for one-document-per-file formats (text), else one per file, or
    per record-aligned piece of a file larger than `max_task_bytes` for a reader that can split (ranges.py)."""
    traits = format_traits(source.format)
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


# Versioned with lmstack itself (its pyproject.toml's entry points); a plug-in reader's code goes into the clean
# stage's fingerprint.
BUILTIN_READERS = READERS.builtin_names()


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
