"""The whole data path as stages of tasks for any executor: clean (one task per work shard) -> the dedup stages
-> train-tokenizer (one task) -> tokenize (one task per corpus shard, then the manifest).

Each stage's tasks call the same functions the stage commands run (clean_shard, the dedup tasks,
train_tokenizer, run_tokenize with a shard index) and keep those stages' own completion markers, so a data
path started on one executor can be finished on another, or by `python -m data_pipeline <stage>`.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from core.log import get_logger
from core.run_layout import RunLayout
from data_pipeline.executors import Executor, Stage, build_executor

log = get_logger(__name__)


def _clean_task(i: int, *, cfg) -> dict[str, Any]:
    from data_pipeline.clean import clean_shard, config_fingerprint, plan_clean

    shard = plan_clean(cfg)[i]
    # per source, as run_clean writes them
    info = clean_shard(cfg, shard, config_fingerprint(cfg, shard.source))
    return {k: info[k] for k in ("source", "shard", "read", "kept", "holdout", "kept_chars")}


def _done_set(done: frozenset[int], i: int) -> bool:
    return i in done


def _resumable_stage(
    cfg, layout: RunLayout, name: str, task, labels: tuple[str, ...], done: frozenset[int], finalize
) -> Stage:
    """A stage of one task per planned item (a work shard, a corpus shard) that the config is all each task needs:
    the items already finished (`done`, read from their own records) are skipped, and `finalize(cfg)` writes the
    stage's report once every task is done. Clean and tokenize are built alike."""
    return Stage(
        name,
        task,
        len(labels),
        layout.tasks,
        kwargs={"cfg": cfg},
        store=layout.store,
        labels=labels,
        done_fn=functools.partial(_done_set, done),
        finalize=functools.partial(finalize, cfg),
    )


def _never_done(i: int) -> bool:
    return False


def _clean_report(cfg) -> dict[str, Any]:
    from data_pipeline.clean import write_report

    summary = write_report(cfg)
    log.info(summary.pop("table"))
    if not summary["complete"]:
        raise RuntimeError("clean: the report is not complete after every task finished")
    return summary


def clean_stage(cfg) -> Stage:
    from data_pipeline.clean import _shard_done, config_fingerprint, plan_clean

    layout = RunLayout(cfg)
    layout.store.pull([layout.clean], prune_markers=True)  # a remote run: only remote markers count
    plan = plan_clean(cfg)
    fps = {s.name: config_fingerprint(cfg, s.name) for s in cfg.data.sources}
    done = frozenset(i for i, s in enumerate(plan) if _shard_done(cfg, s, fps[s.source]))
    labels = tuple(f"{s.source}/{s.index}" for s in plan)
    return _resumable_stage(cfg, layout, "clean", _clean_task, labels, done, _clean_report)


def _tokenizer_task(i: int, *, cfg) -> dict[str, Any]:
    from data_pipeline.tokenizers import train_tokenizer

    return {"tokenizer": str(train_tokenizer(cfg))}


def tokenizer_stage(cfg) -> Stage:
    layout = RunLayout(cfg)
    return Stage(
        "train-tokenizer",
        _tokenizer_task,
        1,
        layout.tasks,
        kwargs={"cfg": cfg},
        done_fn=_never_done,
        store=layout.store,
    )


def _tokenize_task(i: int, *, cfg) -> dict[str, Any]:
    from data_pipeline.tokenize import run_tokenize

    out = run_tokenize(cfg, shard_index=i)
    return {"shards_written": out["shards_written"]}


def _tokenize_manifest(cfg) -> dict[str, Any]:
    from data_pipeline.tokenize import run_tokenize

    return run_tokenize(cfg)  # every shard is done: writes the manifest and the packing index


def tokenize_stage(cfg) -> Stage:
    from pathlib import Path

    from data_pipeline.tokenize import _is_done, _tasks

    tasks, _ = _tasks(cfg)
    layout = RunLayout(cfg)
    layout.store.pull([layout.tokens], prune_markers=True)  # a remote run: only remote records count
    done = frozenset(
        i for i, t in enumerate(tasks) if _is_done(Path(t["stem"]), t["fingerprint"]) is not None
    )
    labels = tuple(Path(t["in_path"]).parent.name + "/" + Path(t["in_path"]).name for t in tasks)
    return _resumable_stage(cfg, layout, "tokenize", _tokenize_task, labels, done, _tokenize_manifest)


def run_data_path(cfg, executor: Executor | None = None) -> dict[str, Any]:
    """clean -> dedup stages -> train-tokenizer -> tokenize on one executor. Stages are built just before they
    run, because each one's task list depends on the previous stage's output."""
    from data_pipeline.dedup import run_dedup

    own = executor is None
    ex = executor or build_executor(cfg)
    out: dict[str, Any] = {"executor": ex.name}
    t0 = time.time()
    try:
        out["clean"] = ex.run(clean_stage(cfg)).summary
        out["dedup"] = run_dedup(cfg, ex)
        out["train-tokenizer"] = ex.run(tokenizer_stage(cfg)).summary
        out["tokenize"] = ex.run(tokenize_stage(cfg)).summary
    finally:
        if own:
            ex.close()
    out["seconds"] = round(time.time() - t0, 2)
    return out
