"""Dedup stage: exact (normalised-content hash) + MinHash-LSH near-dedup over all cleaned shards, as sharded
stages of restartable tasks (see stages.py for the stages and the memory bound of each task), scheduled by the
configured executor (`data.executor`). See minhash.py for the expected precision/recall of (bands, rows).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from core.log import get_logger
from core.run_layout import RunLayout
from data_pipeline.dedup.exact import content_hash
from data_pipeline.dedup.minhash import MinHasher, expected_collision_probability
from data_pipeline.dedup.stages import build_stages
from data_pipeline.executors import Executor, build_executor, run_stages
from data_pipeline.shards import DEDUP_DONE, remove_stale_temps, shard_mismatch, verify_shards

log = get_logger(__name__)

__all__ = ["run_dedup", "run_dedup_task", "MinHasher", "content_hash", "expected_collision_probability"]


def run_dedup(cfg, executor: Executor | None = None) -> dict[str, Any]:
    """Deduplicate the cleaned corpus into dedup/ (only the tasks not yet done); returns dedup_stats.json."""
    t0 = time.time()
    stages = build_stages(cfg)
    # the cleaned shards against clean's markers, before any work (and before a new fingerprint drops _DONE)
    verify_shards(stages[0].kwargs["inputs"], "clean", "dedup", cfg.data.verify_checksums)
    _redo_damaged_outputs(stages[-1], cfg.data.verify_checksums)
    layout = RunLayout(cfg)
    remove_stale_temps(layout.dedup)  # a whole-stage run owns dedup/: what a killed run left is dead
    done = layout.dedup / DEDUP_DONE
    layout.store.pull([done])
    fp = stages[-1].finalize.args[1]  # type: ignore[union-attr]
    try:
        if json.loads(done.read_text()).get("fingerprint") != fp:
            done.unlink()  # another corpus or config: not complete until this run finishes
            layout.store.remove(done)
    except (OSError, ValueError):
        pass
    own = executor is None
    ex = executor or build_executor(cfg)
    try:
        results = run_stages(stages, ex)
    finally:
        if own:
            ex.close()
    stats = results[-1].summary
    stats["stage_seconds"] = {r.stage: r.seconds for r in results}
    stats["tasks_run"] = {r.stage: r.ran for r in results}
    stats["seconds"] = round(time.time() - t0, 2)
    return stats


def _redo_damaged_outputs(filter_stage, checksums: bool) -> None:
    """A deduplicated shard changed since its filter task wrote it (cut, bytes changed, copied over): the task's
    marker goes, so this run writes the shard again and the next stages read what dedup decided."""
    out_root = Path(filter_stage.kwargs["out_root"])
    for i, src in enumerate(filter_stage.kwargs["inputs"]):
        out = out_root / Path(src).parent.name / Path(src).name
        if filter_stage.marker(i).exists():
            why = shard_mismatch(out, checksums)
            if why:
                log.warning(f"dedup: rewriting {out}: {why}")
                filter_stage.marker(i).unlink()


def run_dedup_task(cfg, stage: str, index: int, retries: int = 0) -> dict[str, Any]:
    """One task of one dedup stage (a Slurm array task); skipped when its marker exists."""
    stages = {s.name: s for s in build_stages(cfg)}
    if stage not in stages:
        raise KeyError(f"unknown dedup stage {stage!r}; this run has {list(stages)}")
    s = stages[stage]
    if stage == "dedup-signatures" and 0 <= index < s.num_tasks:  # the first task to read its shard checks it
        verify_shards([s.kwargs["inputs"][index]], "clean", "dedup", cfg.data.verify_checksums)
    if s.is_done(index):
        return {"task": s.task_name(index), "skipped": "done"}
    from data_pipeline.executors.base import run_with_retries

    s.pull()  # a remote run: the earlier stages' files this task reads
    return run_with_retries(s, index, retries)
