"""The task model (`Stage`), its completion markers and the executor registry.

A task writes its outputs atomically, then its marker `<marker_dir>/<stage>-<i:05d>.done` (JSON: the task's
name and the stats it returned). A task whose marker exists is done; a rerun after a crash or a SIGKILL does
only the tasks without one. Stats are merged from the markers, so the report is the same whichever executor
(or mix of executors, or Slurm array) ran the tasks.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import LmstackError
from core.log import get_logger
from core.registry import EXECUTORS
from core.storage import RunStore
from data_pipeline.shards import write_json_atomic

log = get_logger(__name__)


class StageFailed(LmstackError, RuntimeError):
    """Some tasks of a stage still failed after their retries; `failed` maps task name -> last error."""

    def __init__(self, stage: str, failed: dict[str, str], total: int):
        self.stage, self.failed = stage, failed
        names = "; ".join(f"{k}: {v}" for k, v in list(failed.items())[:20])
        more = f" (+{len(failed) - 20} more)" if len(failed) > 20 else ""
        super().__init__(
            f"stage {stage}: {len(failed)} of {total} task(s) failed after retries: {names}{more}. "
            f"Fix the input and rerun: finished tasks are kept and skipped."
        )


@dataclass(frozen=True)
class Stage:
    """N independent tasks. `fn(i, **kwargs)` runs task i and returns its stats (a JSON-able dict).

    `fn` must be a module-level function (pickled by reference to pool workers and Ray workers); `labels[i]`
    names task i in reports (e.g. its input shard). `finalize`, when set, runs once in the driver after every
    task is done (a report, a manifest) and its dict becomes the stage's summary.
    """

    name: str
    fn: Callable[..., dict[str, Any]]
    num_tasks: int
    marker_dir: Path
    kwargs: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    done_fn: Callable[[int], bool] | None = None
    finalize: Callable[[], dict[str, Any]] | None = None
    # A remote run folder (core/storage.py): `outputs` are the local folders the tasks write (uploaded
    # after each task, before its marker), `exclude` folder names inside them that a pull leaves out.
    store: RunStore | None = None
    outputs: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def remote(self) -> bool:
        return self.store is not None and self.store.remote is not None

    def task_name(self, i: int) -> str:
        label = self.labels[i] if i < len(self.labels) else ""
        return f"{self.name}[{i}]" + (f" ({label})" if label else "")

    def marker(self, i: int) -> Path:
        return Path(self.marker_dir) / f"{self.name}-{i:05d}.done"

    def is_done(self, i: int) -> bool:
        if self.done_fn is not None:
            return self.done_fn(i)
        return self.marker_exists(i)

    def marker_exists(self, i: int) -> bool:
        """On a remote run only the remote marker counts (a local one may never have been uploaded)."""
        return self.store.exists(self.marker(i)) if self.remote else self.marker(i).exists()

    def pull(self, markers_only: bool = False) -> None:
        """Remote run: bring the stage's task markers (and, unless `markers_only`, its folders: what the next
        tasks read) here, as other nodes and earlier runs wrote them."""
        if self.remote:
            self.store.pull(
                [self.marker_dir] if markers_only else [*self.outputs, self.marker_dir], exclude=self.exclude
            )

    def markers_present(self) -> set[str]:
        """Names of the task markers that exist (remotely on a remote run), in one listing."""
        if self.remote:
            return set(self.store.list_dir(self.marker_dir))
        d = Path(self.marker_dir)
        return {p.name for p in d.iterdir()} if d.is_dir() else set()

    def todo(self) -> list[int]:
        if self.done_fn is not None:
            return [i for i in range(self.num_tasks) if not self.done_fn(i)]
        have = self.markers_present()
        return [i for i in range(self.num_tasks) if self.marker(i).name not in have]

    def run_task(self, i: int, where: str | None = None) -> dict[str, Any]:
        """Run task i and write its marker (what every executor calls, in whatever process it runs);
        `where` (the node that ran it) goes into the marker."""
        if not 0 <= i < self.num_tasks:
            raise IndexError(f"stage {self.name}: task index {i} outside 0..{self.num_tasks - 1}")
        t0 = time.time()
        stats = self.fn(i, **self.kwargs) or {}
        if self.remote:  # the task's files first (1 s margin: file mtimes come from a coarser clock)
            self.store.push(self.outputs, since=t0 - 1.0)
        write_json_atomic(
            self.marker(i),
            {
                "task": self.task_name(i),
                "seconds": round(time.time() - t0, 3),
                "where": where or socket.gethostname(),
                "stats": stats,
            },
        )
        if self.remote:
            self.store.push([self.marker(i)])
        return stats

    def task_stats(self) -> list[dict[str, Any]]:
        """Stats of every finished task, read back from the markers (executor-independent)."""
        out = []
        for i in range(self.num_tasks):
            try:
                out.append(json.loads(self.marker(i).read_text())["stats"])
            except (OSError, ValueError, KeyError):
                continue
        return out


def run_task_guarded(
    stage: Stage, i: int, where: str | None = None
) -> tuple[int, dict[str, Any] | None, str | None]:
    """(i, stats, None) or (i, None, error text): a failing task never takes its worker down."""
    try:
        return i, stage.run_task(i, where), None
    except Exception as e:
        tb = traceback.format_exc(limit=3)
        return i, None, f"{type(e).__name__}: {e}" + ("" if len(tb) > 1500 else f"\n{tb}")


@dataclass
class StageResult:
    stage: str
    total: int
    ran: int
    skipped: int
    seconds: float
    summary: dict[str, Any] = field(default_factory=dict)


class Progress:
    """A tqdm bar on a terminal, a periodic `[stage] k/N tasks` line otherwise (job logs, CI)."""

    def __init__(self, stage: str, total: int, enabled: bool = True, every_s: float = 10.0):
        self.stage, self.total, self.n, self.every_s = stage, total, 0, every_s
        self.enabled = enabled and total > 0
        self.t0 = self.last = time.time()
        self.bar = None
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=stage, unit="task", file=sys.stderr)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.bar is not None:
            self.bar.update(k)
        elif self.enabled and (time.time() - self.last >= self.every_s or self.n == self.total):
            self.last = time.time()
            log.info(f"[{self.stage}] {self.n}/{self.total} tasks ({time.time() - self.t0:.1f}s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Executor:
    """Schedules a stage's unfinished tasks; subclasses implement `_run(stage, todo, progress)` which returns
    {task index: last error} for the tasks that still failed after `retries` retries."""

    name = "base"

    def __init__(self, retries: int = 2, progress: bool = True):
        if retries < 0:
            raise ValueError(f"retries must be >= 0 (got {retries})")
        self.retries, self.progress = retries, progress

    def _run(self, stage: Stage, todo: list[int], progress: Progress) -> dict[int, str]:
        raise NotImplementedError

    def run(self, stage: Stage) -> StageResult:
        t0 = time.time()
        todo = stage.todo()
        if todo:
            stage.pull()
        for i in todo:  # a marker left by an older run of a stage with its own done test is stale
            stage.marker(i).unlink(missing_ok=True)
        bar = Progress(stage.name, len(todo), self.progress)
        try:
            errors = self._run(stage, todo, bar) if todo else {}
        finally:
            bar.close()
        if errors:
            raise StageFailed(
                stage.name,
                {stage.task_name(i): e.splitlines()[0] for i, e in sorted(errors.items())},
                stage.num_tasks,
            )
        have = stage.markers_present()
        missing = [i for i in todo if stage.marker(i).name not in have]  # "succeeded" without output: a loss
        if missing:
            raise StageFailed(
                stage.name,
                {stage.task_name(i): "no completion marker after the run" for i in missing},
                stage.num_tasks,
            )
        summary = {}
        if stage.finalize is not None:
            stage.pull(markers_only=True)  # finalize merges the markers of tasks that ran on other nodes
            t_fin = time.time()
            summary = stage.finalize()
            if stage.remote:
                stage.store.push(stage.outputs, since=t_fin - 1.0)
        return StageResult(
            stage.name,
            stage.num_tasks,
            len(todo),
            stage.num_tasks - len(todo),
            round(time.time() - t0, 3),
            summary,
        )

    def close(self) -> None:
        """Release resources (pool, cluster connection)."""


def register_executor(name: str):
    """Class decorator: registers an executor under `name` in `core.registry.EXECUTORS` (outside packages: the
    `lmstack.executors` entry point group)."""

    def deco(cls: type[Executor]) -> type[Executor]:
        cls.name = name
        return EXECUTORS.register(name, cls)

    return deco


def build_executor(cfg) -> Executor:
    """The executor named by `data.executor`, configured from the data section (the built-ins register when
    data_pipeline.executors is imported)."""
    cls = EXECUTORS.get(cfg.data.executor)
    return cls.from_config(cfg)  # type: ignore[attr-defined]


def run_stages(stages: list[Stage], executor: Executor) -> list[StageResult]:
    """Run stages in order; a stage starts only after the previous one completed."""
    return [executor.run(s) for s in stages]


def run_with_retries(stage: Stage, i: int, retries: int) -> dict[str, Any]:
    """Run one task in this process, retrying it; raise StageFailed naming it if it never succeeds
    (what a Slurm array task runs)."""
    err = None
    for _ in range(retries + 1):
        _, stats, err = run_task_guarded(stage, i)
        if err is None:
            return stats or {}
        log.warning(f"[{stage.name}] {stage.task_name(i)} failed: {err.splitlines()[0]}")
    raise StageFailed(stage.name, {stage.task_name(i): (err or "").splitlines()[0]}, stage.num_tasks)
