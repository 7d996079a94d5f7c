"""The cleaned corpus as the tokens stage sees it (contract 1, via `data_pipeline.shards`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from data_pipeline.shards import corpus_shards as _corpus_shards
from data_pipeline.shards import iter_corpus, read_shard
from runconfig import RunConfig

__all__ = ["corpus_shards", "iter_texts", "read_shard"]


def corpus_shards(cfg: RunConfig) -> dict[str, list[Path]]:
    """Source name -> finished shard files of the final corpus; an empty corpus is an error naming the stage."""
    out = {k: [Path(p) for p in v] for k, v in _corpus_shards(cfg).items()}
    if not out:
        from data_pipeline.shards import final_stage_dir

        raise FileNotFoundError(
            f"no finished cleaned shards under {final_stage_dir(cfg)}: run `python -m data_pipeline clean` first"
        )
    return out


def iter_texts(cfg: RunConfig, limit: int | None = None) -> Iterator[str]:
    """Stream document texts over every source, never holding the corpus in memory."""
    corpus_shards(cfg)  # fail early and clearly on an empty corpus
    n = 0
    for row in iter_corpus(cfg):
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            continue
        yield text
        n += 1
        if limit is not None and n >= limit:
            return
