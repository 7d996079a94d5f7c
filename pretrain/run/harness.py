"""lm-evaluation-harness, as lmstack calls it: on an export (`python -m adapt evaluate`) and on the weights being
trained (`eval.tasks`, pretrain/callbacks/tasks.py), with the harness's own `HFLM` and task system both times, so
that the in-loop figure of the last step is the export's figure (tests/pretrain/test_eval_signal.py).

Nothing here reimplements a metric or a request. What lmstack adds is the checks a user would otherwise meet
after the model loads (an unknown task, a missing data file, a few-shot count larger than the task's pool), each
one line naming it, and, in the loop, what a training run needs from an evaluation: the tasks loaded once, the
module handed back in training mode, eager (a compiled block would recompile for every padded length), and the
RNG streams left where they were.
"""

from __future__ import annotations

import io
import logging
import random
import time
from contextlib import redirect_stderr
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from core.errors import LmstackError
from core.log import get_logger

log = get_logger(__name__)


class EvaluateError(LmstackError):
    """A refusal of a harness evaluation, before any model loads."""


def harness_task_manager():
    """The harness's TaskManager class; a missing extra named."""
    try:
        import lm_eval  # noqa: F401
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise EvaluateError(
            f"lm-evaluation-harness is not installed ({e.name or 'lm_eval'}): pip install 'lmstack[eval]'"
        ) from None
    return TaskManager


def _local_configs(tasks_dir: Path | None) -> dict[str, dict[str, Any]]:
    if tasks_dir is None:
        return {}
    out = {}
    for f in sorted(tasks_dir.glob("*.yaml")):
        conf = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
        if isinstance(conf, dict) and "task" in conf:
            out[str(conf["task"])] = conf | {"_file": str(f)}
    return out


def check_tasks(names: list[str], tasks_dir: Path | None, num_fewshot: int | None) -> Any:
    """The harness's TaskManager over its own tasks and `tasks_dir`'s; every name known, every local task's data
    file there, the few-shot count within a local task's pool."""
    task_manager_cls = harness_task_manager()
    if tasks_dir is not None and not tasks_dir.is_dir():
        raise EvaluateError(
            f"--tasks-dir {tasks_dir}: no such folder (`python -m data_pipeline eval-tasks` writes it)"
        )
    local = _local_configs(tasks_dir)
    local_names = set(local) | {t for c in local.values() for t in c.get("tag", [])}
    # indexing the harness's own few thousand task files takes seconds: only when a name is not a local one
    manager = task_manager_cls(
        include_path=str(tasks_dir) if tasks_dir else None,
        include_defaults=not set(names) <= local_names,
        verbosity="ERROR",
    )
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            close = get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            where = (
                f" in {tasks_dir}"
                if tasks_dir
                else " (no --tasks-dir: `python -m data_pipeline eval-tasks` writes them)"
            )
            raise EvaluateError(
                f"--tasks: unknown task '{name}'{hint} (local tasks{where}: {sorted(local) or 'none'}; the "
                "harness's own need their datasets from the network)"
            )
    chosen = {n: c for n, c in local.items() if n in names or any(t in names for t in c.get("tag", []))}
    for name, conf in chosen.items():
        files = conf.get("dataset_kwargs", {}).get("data_files", {})
        for split, path in files.items():
            if not Path(path).is_file():
                raise EvaluateError(
                    f"{conf['_file']}: task '{name}' reads {path} ({split} split), which does not exist; rerun "
                    "`python -m data_pipeline eval-tasks`"
                )
        if num_fewshot:
            if conf.get("output_type") == "loglikelihood_rolling":
                raise EvaluateError(
                    f"--num-fewshot {num_fewshot}: task '{name}' is a perplexity, scored 0-shot"
                )
            dev = files.get(conf.get("fewshot_split", ""), None)
            pool = sum(1 for _ in open(dev, encoding="utf-8")) if dev else 0
            if num_fewshot > pool:
                raise EvaluateError(
                    f"--num-fewshot {num_fewshot}: task '{name}' has {pool} few-shot examples (its dev split)"
                )
    return manager


def quiet_harness() -> None:
    """The harness logs each metric default it fills in, per task, at WARNING, and warns that a model object was
    passed rather than a name: not news to a user."""
    for name in ("lm-eval", "lm_eval", "lm_eval.api.task", "lm_eval.evaluator", "lm_eval.models.huggingface"):
        logging.getLogger(name).setLevel(logging.ERROR)


def figures(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The harness's results -> task -> metric -> value (the `none` filter's figures, without their stderr)."""
    out: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        row = {}
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if filt == "none" and not metric.endswith("_stderr") and isinstance(value, int | float):
                row[metric] = float(value)
        out[task] = row
    return out


def _process_group_lm(module: Any, tokenizer: Any, batch_size: int, rank: int, world: int) -> Any:
    """`HFLM` around `module`, on the run's process group: the harness's own data-parallel path (each rank scores
    the documents `doc_iterator(rank, world_size)` gives it, rank 0 gathers the per-document figures and
    aggregates them) through torch.distributed, where the harness's CLI uses accelerate's launcher."""
    import torch
    import torch.distributed as dist
    from lm_eval.models.huggingface import HFLM

    class RunLM(HFLM):
        def all_gather(self, tensor):
            if self.world_size <= 1:
                return tensor
            parts = [torch.zeros_like(tensor) for _ in range(self.world_size)]
            dist.all_gather(parts, tensor)
            return torch.cat([p.reshape(-1) for p in parts])  # accelerate's gather: concatenated

        def barrier(self):
            if self.world_size > 1:
                dist.barrier()

    lm = RunLM(pretrained=module, tokenizer=tokenizer, batch_size=batch_size)
    lm._rank, lm._world_size = rank, world
    return lm


class TaskScorer:
    """The harness's tasks loaded once (every rank), scored on a module at each call: `HFLM` wraps the module as
    it is (no copy, no export), and the harness's `evaluate` runs its own requests and metrics on it, as
    `simple_evaluate` does for an export (0-shot unless the task says otherwise, the same few-shot seed). Under
    torch.distributed the documents are shared out over the ranks (each holds the whole weights at ZeRO 0-2) and
    rank 0 gets the figures; tasks with fewer than two documents per rank are scored on rank 0 alone."""

    def __init__(
        self,
        names: list[str],
        tasks_dir: Path,
        tokenizer_dir: Path,
        limit: int | None,
        batch_size: int,
        rank: int = 0,
        world: int = 1,
    ):
        from transformers import AutoTokenizer

        manager = check_tasks(names, tasks_dir, None)
        quiet_harness()
        self.loaded = manager.load(names)
        for task in self.loaded["tasks"].values():
            if task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)
            task.set_fewshot_seed(seed=1234)  # simple_evaluate's default fewshot_random_seed
        # its own instance: the harness sets a pad token on the tokenizer it is given
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.limit, self.batch_size = limit, batch_size
        self.names = sorted(self.loaded["tasks"])
        docs = min(min(len(t.eval_docs), limit or len(t.eval_docs)) for t in self.loaded["tasks"].values())
        self.rank, self.world = (rank, world) if docs >= world * 2 else (0, 1)
        self.scores = rank == 0 or self.world > 1  # whether this rank takes part in scoring

    def score(self, module: Any) -> tuple[dict[str, dict[str, float]], float]:
        """Task -> metric -> value on `module`'s current weights ({} on ranks other than 0), and the seconds it
        took."""
        import torch
        from lm_eval.evaluator import evaluate

        t0 = time.perf_counter()
        if not self.scores:
            return {}, 0.0
        was_training = module.training
        py_state, np_state = random.getstate(), np.random.get_state()
        # transformers warns, once per process, about a rolling text longer than the window (the harness splits
        # it) and a padded batch without a mask (the harness reads only the positions it scored): not the run's news
        hf_log = logging.getLogger("transformers")
        hf_level = hf_log.level
        hf_log.setLevel(logging.ERROR)
        try:
            # the harness's progress bars (stderr) would cut through the run's own; no bootstrap: the in-loop
            # rows carry figures, not their standard errors (the export's `adapt evaluate` has them)
            with torch.no_grad(), torch.compiler.set_stance("force_eager"), redirect_stderr(io.StringIO()):
                lm = _process_group_lm(module, self.tokenizer, self.batch_size, self.rank, self.world)
                results = evaluate(
                    lm=lm, task_dict=self.loaded, limit=self.limit, bootstrap_iters=0, verbosity="ERROR"
                )
        finally:
            hf_log.setLevel(hf_level)
            module.train(was_training)
            random.setstate(py_state)
            np.random.set_state(np_state)
        return figures(results or {}), time.perf_counter() - t0
