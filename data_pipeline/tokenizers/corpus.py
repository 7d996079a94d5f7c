"""The cleaned corpus as the tokens stage sees it (contract 1, via `data_pipeline.shards`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from core.errors import LmstackError
from data_pipeline.shards import corpus_shards as _corpus_shards
from data_pipeline.shards import final_stage_dir, iter_corpus, read_shard, verify_shards
from runconfig import RunConfig

__all__ = ["EmptyStageError", "corpus_shards", "iter_texts", "read_shard", "require_texts", "verify_corpus"]


class EmptyStageError(LmstackError, ValueError):
    """A stage's output holds no documents: nothing downstream can be trained from it."""


def corpus_shards(cfg: RunConfig) -> dict[str, list[Path]]:
    """Source name -> finished shard files of the final corpus; an empty corpus is an error naming the stage."""
    out = {k: [Path(p) for p in v] for k, v in _corpus_shards(cfg).items()}
    if not out:
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


def verify_corpus(cfg: RunConfig, reader: str, paths: list[Path] | None = None) -> None:
    """The final corpus's shards (or `paths` of it) against the markers of the stage that wrote them (dedup, or
    clean without dedup) before `reader` reads them: one line naming a shard that changed and the stage to rerun."""

    if paths is None:
        paths = [p for ps in _corpus_shards(cfg).values() for p in ps]
    verify_shards(paths, final_stage_dir(cfg).name, reader, cfg.data.verify_checksums)


def require_texts(cfg: RunConfig) -> None:
    """Stop before training on an empty corpus (BPE used to exit 0 with a 261-token byte-only tokenizer and
    Unigram to crash inside sentencepiece), naming the stage whose output is empty."""
    shards = corpus_shards(cfg)
    if next(iter_texts(cfg, limit=1), None) is None:
        stage = final_stage_dir(cfg)
        n = sum(len(v) for v in shards.values())
        raise EmptyStageError(
            f"tokenizer training: the '{stage.name}' stage kept no text: its {n} finished shard(s) under {stage} "
            f"hold 0 documents; see {stage / 'stats.txt' if stage.name == 'clean' else stage} for why, and check "
            f"data.sources and data.clean"
        )


def batched(texts: Iterator[str], n: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
