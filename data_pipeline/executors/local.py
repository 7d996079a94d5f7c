"""The local executor: a process pool on this machine (one worker = in-process, easiest to debug)."""

from __future__ import annotations

import multiprocessing as mp
import sys
from concurrent.futures import as_completed
from concurrent.futures.process import BrokenProcessPool

from data_pipeline.executors.base import Executor, Progress, Stage, register_executor, run_task_guarded
from data_pipeline.interrupt import process_pool


@register_executor("local")
class LocalExecutor(Executor):
    def __init__(self, workers: int = 1, retries: int = 2, progress: bool = True):
        super().__init__(retries, progress)
        if workers < 1:
            raise ValueError(f"workers must be >= 1 (got {workers})")
        self.workers = workers

    @classmethod
    def from_config(cls, cfg) -> LocalExecutor:
        return cls(cfg.data.clean.workers, cfg.data.task_retries, cfg.data.clean.progress)

    def _run(self, stage: Stage, todo: list[int], progress: Progress) -> dict[int, str]:
        errors: dict[int, str] = {}
        pending = list(todo)
        for _attempt in range(self.retries + 1):
            if not pending:
                break
            errors = self._attempt(stage, pending, progress)
            pending = sorted(errors)
        return errors

    def _attempt(self, stage: Stage, todo: list[int], progress: Progress) -> dict[int, str]:
        errors: dict[int, str] = {}
        workers = min(self.workers, len(todo))
        if workers <= 1:
            for i in todo:
                _, _, err = run_task_guarded(stage, i)
                if err:
                    errors[i] = err
                else:
                    progress.update()
            return errors
        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        with process_pool(workers, ctx) as pool:
            futs = {pool.submit(run_task_guarded, stage, i): i for i in todo}
            for fut in as_completed(futs):
                try:
                    _, _, err = fut.result()
                except BrokenProcessPool as e:  # a worker was killed (OOM, signal): retry its task
                    err = f"worker process died: {e}"
                if err:
                    errors[futs[fut]] = err
                else:
                    progress.update()
        return errors
