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
from pathlib import Path
from typing import Any

from core.export_files import weights_hash
from core.io import atomic_write
from core.log import get_logger
from pretrain.run.harness import EvaluateError, check_tasks, quiet_harness

__all__ = ["EvaluateError", "check_causal", "check_tasks", "evaluate"]

log = get_logger(__name__)

RESULTS_JSON = "lm_eval_results.json"
RESULTS_TABLE = "lm_eval_results.md"
LOCAL_TASKS = "eval_tasks"  # the run folder's (core/layout.py EVAL_TASKS), beside export/


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

    quiet_harness()
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
