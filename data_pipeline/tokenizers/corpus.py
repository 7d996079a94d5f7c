"""Read the cleaned corpus (contract 1) for the tokens stage.

Delegates to `data_pipeline.shards` (the cleaning stage's reader: dedup output when present, else clean output).
The fallback below reads the same contract directly so the tokens stage keeps working in a checkout where the
cleaning module is absent or older; it is not a second format.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

from runconfig import RunConfig


def corpus_shards(cfg: RunConfig) -> dict[str, list[Path]]:
    """Source name -> sorted cleaned shard paths of the final corpus."""
    try:
        from data_pipeline.shards import corpus_shards as _cs
    except ImportError:
        return _fallback_corpus_shards(cfg)
    return {k: [Path(p) for p in v] for k, v in _cs(cfg).items()}


def read_shard(path: str | Path) -> Iterator[dict]:
    try:
        from data_pipeline.shards import read_shard as _rs
    except ImportError:
        yield from _fallback_read_shard(Path(path))
        return
    yield from _rs(path)


def iter_texts(cfg: RunConfig, limit: int | None = None) -> Iterator[str]:
    """Stream document texts over every source, never holding the corpus in memory."""
    n = 0
    for paths in corpus_shards(cfg).values():
        for p in paths:
            for row in read_shard(p):
                text = row.get("text") or ""
                if not text:
                    continue
                yield text
                n += 1
                if limit is not None and n >= limit:
                    return


def _fallback_corpus_shards(cfg: RunConfig) -> dict[str, list[Path]]:
    from data_pipeline.layout import RunLayout

    layout = RunLayout(cfg)
    out: dict[str, list[Path]] = {}
    for src in cfg.data.sources:
        for root in (layout.dedup, layout.clean):
            files = sorted((root / src.name).glob("shard-*.jsonl.zst")) + sorted(
                (root / src.name).glob("shard-*.parquet")
            )
            if files:
                out[src.name] = files
                break
    if not out:
        raise FileNotFoundError(f"no cleaned shards under {layout.dedup} or {layout.clean}: run the clean stage first")
    return out


def _fallback_read_shard(path: Path) -> Iterator[dict]:
    if path.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            yield from batch.to_pylist()
        return
    import zstandard

    with open(path, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as zr:
        for line in io.TextIOWrapper(zr, encoding="utf-8"):
            if line.strip():
                yield json.loads(line)
