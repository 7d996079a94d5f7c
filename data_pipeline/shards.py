"""Cleaned-corpus shards (contract 1): atomic writers, readers, completion markers, the final-corpus view.

A shard is `<stage>/<source>/shard-XXXXX.jsonl.zst` (or `.parquet`) with rows
{"id","text","url","timestamp","source"[,"label"]}. It is written to a temporary name, fsynced and renamed, so
a crash never leaves a half-written file under the final name; `shard-XXXXX.done` (JSON: counts, stats) is
written last, the same way, and is what a rerun checks to skip finished work.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from core.errors import LmstackError
from core.io import atomic_write, json_bytes, remove_orphans, sha256_file
from core.log import get_logger
from core.run_layout import RunLayout

log = get_logger(__name__)

SHARD_EXTS = (".jsonl.zst", ".parquet")
DEDUP_DONE = "_DONE.json"


def shard_name(index: int, fmt: str) -> str:
    return f"shard-{index:05d}.{fmt}"


def marker_path(shard_path: Path) -> Path:
    name = shard_path.name
    for ext in SHARD_EXTS:
        if name.endswith(ext):
            name = name[: -len(ext)]
    return shard_path.with_name(name + ".done")


def is_temp_name(name: str) -> bool:
    """A temporary file of an atomic write (`.<name>.<random>.tmp`, core/io.py) or of a token shard being written
    (`.<stem>.bin.tmp<pid>`, token_shards.py)."""
    return name.startswith(".") and (name.endswith(".tmp") or ".bin.tmp" in name)


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete every temporary file under `folder` left by a killed run. Only for a run of a whole stage, which owns
    its output folder (nothing else writes there meanwhile); a single task (`--shard-index`, `--stage`) cleans
    only its own files (`remove_orphans`)."""
    folder = Path(folder)
    gone = [p for p in folder.rglob(".*") if p.is_file() and is_temp_name(p.name)] if folder.is_dir() else []
    for p in gone:
        p.unlink(missing_ok=True)
    if gone:
        log.info(f"[shards] removed {len(gone)} temporary file(s) of an interrupted run under {folder}")
    return gone


def _atomic_write_bytes(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # a shard or its marker has one writer: earlier temps of it are orphans
    if path.name.startswith("shard-"):
        remove_orphans(path)
    atomic_write(path, write)


def write_json_atomic(path: Path, obj: Any) -> None:
    _atomic_write_bytes(Path(path), lambda f: f.write(json_bytes(obj)))


def write_text_atomic(path: Path, text: str) -> None:
    _atomic_write_bytes(Path(path), lambda f: f.write(text.encode()))


def write_shard(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically as JSONL.zst or Parquet (chosen by the file name); returns the row count."""
    path = Path(path)
    count = 0
    if path.name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = list(records)
        count = len(rows)
        cols = ["id", "text", "url", "timestamp", "source"] + (
            ["label"] if any("label" in r for r in rows) else []
        )
        table = pa.table(
            {
                c: pa.array([None if r.get(c) is None else str(r.get(c)) for r in rows], type=pa.string())
                for c in cols
            }
        )

        def _w(f):
            pq.write_table(table, f, compression="zstd")
    else:
        import zstandard

        def _w(f):
            nonlocal count
            with zstandard.ZstdCompressor(level=3).stream_writer(f, closefd=False) as z:
                buf = io.TextIOWrapper(z, encoding="utf-8", write_through=True)
                for r in records:
                    buf.write(json.dumps(r, ensure_ascii=False))
                    buf.write("\n")
                    count += 1
                buf.flush()
                buf.detach()

    _atomic_write_bytes(path, _w)
    return count


def read_shard(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows of one cleaned shard, streamed."""
    path = Path(path)
    if path.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=1024):
            for r in batch.to_pylist():
                if r.get("label") is None:
                    r.pop("label", None)
                yield r
        return
    with open(path, "rb") as fh:
        for line in _zstd_lines(fh, path):
            if line.strip():
                yield json.loads(line)


def _zstd_lines(fh, path: Path) -> Iterator[bytes]:
    """Lines of a zstd file. zstandard's stream_reader returns a truncated frame as a short (even empty)
    stream without an error, which would pass a damaged shard off as a smaller one; decompressobj tells us
    whether the frame ended, so a truncated or damaged shard raises, naming the file."""
    import zstandard

    dobj = zstandard.ZstdDecompressor().decompressobj()
    buf = b""
    try:
        while chunk := fh.read(1 << 20):
            while chunk:
                buf += dobj.decompress(chunk)
                chunk = dobj.unused_data if dobj.eof else b""
                if chunk:  # a second frame follows
                    dobj = zstandard.ZstdDecompressor().decompressobj()
            *lines, buf = buf.split(b"\n")
            yield from lines
    except zstandard.ZstdError as e:
        raise ValueError(f"{path}: corrupt zstd data: {e}") from e
    if not dobj.eof:
        raise EOFError(f"{path}: truncated zstd stream (the frame does not end)")
    if buf:
        yield buf


def mark_done(shard_path: Path, info: dict[str, Any]) -> None:
    """The shard's completion marker, with the shard's size and sha256: what the next stage checks it against."""
    p = Path(shard_path)
    write_json_atomic(marker_path(p), {**info, "size": p.stat().st_size, "sha256": sha256_file(p)})


class ShardMismatchError(LmstackError, ValueError):
    """A shard of an earlier stage that no longer matches its completion marker (size, sha256): one line naming
    the file, what differs and the stage to rerun."""


def shard_mismatch(path: Path, checksums: bool = True) -> str | None:
    """Why `path` does not match its marker (None: it matches, or its marker predates sizes and checksums)."""
    path = Path(path)
    try:
        rec = json.loads(marker_path(path).read_text())
    except (OSError, ValueError) as e:
        return f"its completion marker {marker_path(path).name} cannot be read ({type(e).__name__})"
    if not isinstance(rec, dict) or "size" not in rec:
        return None  # written before markers carried size and sha256: nothing to compare with
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "the file is missing"
    if size != rec["size"]:
        cut = " (truncated)" if size < rec["size"] else ""
        return f"{size} bytes where its marker records {rec['size']}{cut}"
    if checksums and rec.get("sha256") and sha256_file(path) != rec["sha256"]:
        return "its sha256 differs from its marker's (bytes changed, or another shard copied over it)"
    return None


def verify_shards(paths: Iterable[Path], stage: str, reader: str, checksums: bool = True) -> None:
    """Check the shards `reader` is about to read against the markers `stage` wrote with them, before any work
    (issue 25 item 2): a mismatch stops the stage with one line naming the file and the stage to rerun, which
    rewrites a shard that fails this check."""
    for p in paths:
        why = shard_mismatch(p, checksums)
        if why:
            raise ShardMismatchError(
                f"{reader}: input {p}: {why}; rerun `python -m data_pipeline {stage}` (it rewrites a shard that "
                f"fails this check), then `{reader}`"
            )


def is_done(shard_path: Path) -> bool:
    return marker_path(Path(shard_path)).exists() and Path(shard_path).exists()


def _source_shards(folder: Path, names: list[str] | None) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    if not folder.is_dir():
        return out
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if names is not None and sub.name not in names:
            continue
        files = sorted(
            p
            for p in sub.iterdir()
            if p.name.startswith("shard-") and p.name.endswith(SHARD_EXTS) and marker_path(p).exists()
        )
        if files:
            out[sub.name] = files
    return out


def final_stage_dir(cfg) -> Path:
    """dedup/ when dedup is enabled and has completed, else clean/."""
    layout = RunLayout(cfg)
    dd = cfg.data.dedup
    if (dd.exact or dd.minhash.enabled) and (layout.dedup / DEDUP_DONE).exists():
        return layout.dedup
    return layout.clean


def pull_corpus(cfg) -> None:
    """A remote run: bring the final corpus (dedup/ without its work files, else clean/) into the local folder."""
    layout = RunLayout(cfg)
    if layout.store.remote is None:
        return
    layout.store.pull([layout.dedup], exclude=("_work",))
    if final_stage_dir(cfg) == layout.clean:
        layout.store.pull([layout.clean])


def corpus_shards(cfg) -> dict[str, list[Path]]:
    """source name -> finished shard files of the final corpus, in order."""
    names = [s.name for s in cfg.data.sources]
    return _source_shards(final_stage_dir(cfg), names)


def iter_corpus(cfg, sources: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every row of the final corpus (optionally only some sources), source by source, shard by shard."""
    for name, files in corpus_shards(cfg).items():
        if sources is not None and name not in sources:
            continue
        for f in files:
            yield from read_shard(f)
