"""`eval.tasks` as a callback: lm-evaluation-harness tasks scored on the weights being trained at every eval
(OLMo-core's DownstreamEvaluator, llm-foundry's in-context-learning gauntlet), through the harness itself
(pretrain/run/harness.py), so the last step's figure is what `python -m adapt evaluate` gives on the export.

Every rank loads the tasks once and scores its share of the documents (the harness's own data-parallel path);
rank 0 gathers and logs the figures. The random-init figure is measured once, before the first step of a fresh
run, and carried in the checkpoints: a resume never measures it on trained weights. The tasks' files are the
run's `eval_tasks/` (`python -m data_pipeline eval-tasks`), written at the start when absent.
"""

from __future__ import annotations

from typing import Any

from core.callbacks import Callback
from core.errors import CannotContinueError, LmstackError
from core.log import get_logger

log = get_logger(__name__)

PREFIX = "tasks/"
RANDOM_INIT = "_random_init"  # tasks/<task>/<metric>_random_init: the same metric on the random-init weights


def flat(figures: dict[str, dict[str, float]], suffix: str = "") -> dict[str, float]:
    return {f"{PREFIX}{task}/{m}{suffix}": v for task, row in figures.items() for m, v in row.items()}


class InLoopTasks(Callback):
    name = "tasks"
    section = "eval"

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.saved: dict[str, Any] | None = None
        self.random_init: dict[str, dict[str, float]] | None = None
        self.scorer: Any = None
        self._figures: dict[str, dict[str, float]] = {}

    def enabled(self) -> bool:
        return bool(self.settings.tasks)

    def load_state_dict(self, state: Any, step: int) -> None:
        self.saved = state

    def _key(self) -> dict[str, Any]:
        """What a carried random-init figure must have been measured with to stand for this run's."""
        return {"tasks": sorted(self.settings.tasks), "limit": self.settings.tasks_limit}

    def on_start(self, run: Any, progress: Any) -> dict[str, Any] | None:
        import torch.distributed as dist

        # rank 0 writes the tasks' files when they are absent; then every rank loads them (each scores a share of
        # the documents), and every rank stops with what any one met, instead of waiting for it at the first eval
        error = None
        if run.rank == 0:
            error = self._attempt(lambda: self._write(run))
        if dist.is_initialized():
            dist.barrier()
        if error is None:
            error = self._attempt(lambda: self._load(run))
        if dist.is_initialized():
            said: list[str | None] = [None] * run.world
            dist.all_gather_object(said, error)
            error = next((f"(rank {r}) {e}" for r, e in enumerate(said) if e), None)
        if error is not None:  # a rerun meets it again until the tasks' files are fixed
            raise CannotContinueError(f"eval.tasks: {error}")
        saved = self.saved
        if saved and {k: saved.get(k) for k in ("tasks", "limit")} == self._key():
            self.random_init = saved["figures"]
            return {}
        if progress.step > 0:
            if run.rank == 0:
                log.warning(
                    f"[tasks] the checkpoint at step {progress.step} carries no random-init figure for eval.tasks "
                    f"{self.settings.tasks} (limit {self.settings.tasks_limit}): none is reported"
                )
            return {}
        from pretrain.run.step import rng_isolated

        with rng_isolated():  # before the loop's first step: the dropout stream must not move
            row = self._measure(run)
        self.random_init = self._figures
        return row

    @staticmethod
    def _attempt(work: Any) -> str | None:
        try:
            work()
        except Exception as e:
            return f"{e}" if isinstance(e, LmstackError) else f"{type(e).__name__}: {e}"
        return None

    def _write(self, run: Any) -> None:
        from data_pipeline.eval_tasks import write_eval_tasks

        if not (run.layout.eval_tasks / "tasks.json").is_file():
            write_eval_tasks(run.cfg)

    def _load(self, run: Any) -> None:
        from pretrain.run.harness import TaskScorer

        folder = run.layout.eval_tasks
        self.scorer = TaskScorer(
            self.settings.tasks,
            folder,
            run.layout.tokenizer,
            self.settings.tasks_limit,
            run.cfg.finetune.eval_batch_size,
            run.rank,
            run.world,
        )
        if run.rank == 0:
            shared = f"over {self.scorer.world} ranks" if self.scorer.world > 1 else "on rank 0"
            log.info(
                f"[tasks] eval.tasks: {', '.join(self.scorer.names)} from {folder}, limit "
                f"{self.settings.tasks_limit}, scored {shared}"
            )

    def _measure(self, run: Any) -> dict[str, Any]:
        """Every rank scores its share; rank 0 has the figures ({} elsewhere)."""
        import torch.distributed as dist

        out: dict[str, Any] = {}
        self._figures, seconds = self.scorer.score(run.engine.module)
        if run.rank == 0:
            out = flat(self._figures) | {f"{PREFIX}seconds": seconds}
            out |= flat(self.random_init or self._figures, RANDOM_INIT)
        if dist.is_initialized() and self.scorer.world == 1:
            dist.barrier()  # scored on rank 0 alone: the others wait here (shared out, the harness's gather syncs)
        return out

    def on_eval(self, run: Any, step: int) -> dict[str, Any]:
        # the loop isolates the torch RNG around evaluation; the scorer python's and numpy's
        return self._measure(run)

    def state_dict(self) -> Any:
        if self.random_init is None:
            return None
        return self._key() | {"figures": self.random_init}
