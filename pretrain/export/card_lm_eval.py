"""lm-evaluation-harness results on the model card: `adapt evaluate` writes the harness's JSON beside the export
(`lm_eval_results.json`, with the weights' sha256 it scored), and `pretrain card` turns it into `model-index`
entries (task, metric, value, few-shot count and limit, the harness and task versions) and a table.

Results of other weights (an export replaced since) are left out, as stale transfer results are."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult

from core.export_files import weights_hash

RESULTS_FILE = "lm_eval_results.json"  # adapt/evaluate.py RESULTS_JSON


def bound_lm_eval(export_dir: Path) -> dict[str, Any] | None:
    """The folder's harness results when they scored these very weights; None otherwise."""
    path = Path(export_dir) / RESULTS_FILE
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    scored = (results.get("lmstack") or {}).get("weights_sha256")
    return results if scored and scored == weights_hash(export_dir) else None


def _rows(results: dict[str, Any]) -> list[tuple[str, Any, Any, str, float]]:
    """(task, version, n-shot, metric, value) for every figure (stderr and aliases left out), in task order."""
    out = []
    for task, figures in sorted(results.get("results", {}).items()):
        version = results.get("versions", {}).get(task)
        shots = results.get("n-shot", {}).get(task)
        for key, value in figures.items():
            metric, _, _filter = key.partition(",")
            if "stderr" in metric or metric == "alias" or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                continue
            out.append((task, version, shots, metric, float(value)))
    return out


def lm_eval_card(results: dict[str, Any]) -> tuple[list[EvalResult], list[str]]:
    """The model-index entries and the body's lines for the harness's results."""
    ours = results.get("lmstack") or {}
    harness = f"lm-evaluation-harness {results.get('lm_eval_version', '?')}"
    entries, lines = [], []
    for task, version, shots, metric, value in _rows(results):
        entries.append(
            EvalResult(
                task_type="text-generation",
                task_name=task,
                dataset_type=task,
                dataset_name=task,
                dataset_split="test",
                metric_type=metric,
                metric_value=round(value, 6),
                metric_config=f"{shots}-shot" if shots is not None else None,
                metric_args={"num_fewshot": shots, "limit": ours.get("limit"), "task_version": version},
                source_name=harness,
                source_url="https://github.com/EleutherAI/lm-evaluation-harness",
            )
        )
        lines.append(f"| {task} | {version} | {shots} | {metric} | {value:.4f} |")
    if not lines:
        return [], []
    limit = ours.get("limit")
    body = [
        "",
        f"Scored with {harness} (`python -m adapt evaluate`"
        + (f", {limit:g} examples per task" if limit else ", every example")
        + "):",
        "",
        "| task | version | n-shot | metric | value |",
        "|---|---|---|---|---|",
        *lines,
    ]
    return entries, body
