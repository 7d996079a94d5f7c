"""`python -m adapt evaluate`: an export scored by lm-evaluation-harness, as the field scores its models.

The harness does the work: its own `HFLM` (`model="hf"`) loads the folder with transformers and its task
system reads the tasks, the named ones it ships (for machines that can reach their datasets) and the local ones
`python -m data_pipeline eval-tasks` writes into `<run>/eval_tasks` (data_pipeline/eval_tasks.py), which need
nothing from the network. Nothing here reimplements a metric. What lmstack adds is the checks a user would
otherwise meet after the model loads (an encoder export, an unknown task, a missing data file, a few-shot count
larger than the task's pool), each one line naming it, and the results written beside the export
(`lm_eval_results.json`, the harness's own JSON, and `lm_eval_results.md`, its table) where `pretrain card`
finds them for the card's `model-index`.
"""

from __future__ import annotations

import json
import logging
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import yaml

from core.errors import LmstackError
from core.export_files import weights_hash
from core.io import atomic_write
from core.log import get_logger

log = get_logger(__name__)

RESULTS_JSON = "lm_eval_results.json"
RESULTS_TABLE = "lm_eval_results.md"
LOCAL_TASKS = "eval_tasks"  # the run folder's (core/layout.py EVAL_TASKS), beside export/


class EvaluateError(LmstackError):
    """A refusal of `adapt evaluate`, before any model loads."""


def _harness():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise EvaluateError(
            f"adapt evaluate needs lm-evaluation-harness ({e.name or 'lm_eval'} is not installed): "
            "pip install 'lmstack[eval]'"
        ) from None
    return TaskManager


def check_causal(model: Path) -> dict[str, Any]:
    """The folder's config.json, refused unless it is a causal LM: the harness scores next-token
    log-likelihoods, which an encoder (masked LM, replaced-token detection) or T5's span corruption does not give."""
    cfg_file = model / "config.json"
    if not cfg_file.is_file():
        raise EvaluateError(f"--model {model}: no config.json there (not a from_pretrained folder)")
    conf = json.loads(cfg_file.read_text(encoding="utf-8"))
    archs = conf.get("architectures") or []
    if not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        kind = conf.get("model_type", "?")
        raise EvaluateError(
            f"--model {model}: a {kind} export ({', '.join(archs) or 'no architectures'}) is not a causal LM: "
            "lm-evaluation-harness scores next-token log-likelihoods, which it does not give; score an encoder "
            "with `python -m adapt transfer` (fine-tuning) or eval.probe_task (the in-loop probe)"
        )
    return conf


def default_tasks_dir(model: Path) -> Path | None:
    """<run>/eval_tasks beside <run>/export, when there is one."""
    d = model.resolve().parent / LOCAL_TASKS
    return d if d.is_dir() else None


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
    task_manager_cls = _harness()
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


def _quiet_harness() -> None:
    """The harness logs each metric default it fills in, per task, at WARNING: not news to a user."""
    for name in ("lm-eval", "lm_eval", "lm_eval.api.task", "lm_eval.evaluator"):
        logging.getLogger(name).setLevel(logging.ERROR)


def evaluate(
    model: Path,
    tasks: list[str],
    tasks_dir: Path | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    device: str | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Runs the harness on `model`; writes its JSON and table into `out` (default: the model folder). Returns
    the harness's results dict."""
    check_causal(model)
    if tasks_dir is None:
        tasks_dir = default_tasks_dir(model)
    manager = check_tasks(tasks, tasks_dir, num_fewshot)
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, make_table

    _quiet_harness()
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    results = simple_evaluate(
        model="hf",
        model_args={
            "pretrained": str(model),
            "dtype": "float32" if device == "cpu" else "auto",
            "device": device,
        },
        tasks=tasks,
        num_fewshot=num_fewshot,
        limit=limit,
        batch_size=batch_size,
        task_manager=manager,
        log_samples=False,
        verbosity="ERROR",
    )
    if results is None:  # a non-zero rank of a multi-process harness run
        return {}
    results["lmstack"] = {
        "limit": limit,
        "num_fewshot": num_fewshot,
        "tasks_dir": str(tasks_dir or ""),
        "weights_sha256": weights_hash(model),  # `pretrain card` uses the results only for these weights
    }
    folder = out or model
    folder.mkdir(parents=True, exist_ok=True)
    table = make_table(results)
    atomic_write(folder / RESULTS_JSON, json.dumps(results, indent=1, default=handle_non_serializable) + "\n")
    atomic_write(folder / RESULTS_TABLE, table + "\n")
    return results | {"table": table, "written": str(folder / RESULTS_JSON)}
