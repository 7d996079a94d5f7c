"""`pretrain finetune`: sequence classification (text-to-text for encoder-decoders) of an export with the HF
`Trainer`, one folder per task, arm and seed, each holding the fine-tuned model, its tokenizer and result.json.

The same code path as the transfer evaluation (`adapt.transfer`): the labelled data, splits, long-input
handling and Trainer arguments are shared, so a model fine-tuned here scores what the transfer report says.
With several learning rates in `finetune.lr_grid` the one with the best dev accuracy (first seed) is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from adapt.inputs import frame_pair_task
from adapt.scoring import task_metric
from adapt.transfer import _log, method_lr_grid, pick_lr, prepare_task
from core.registry import ADAPT_METHODS
from data_pipeline.labelled import load_tasks
from pretrain.export.folder import verify_export
from runconfig import RunConfig


def finetune(
    cfg: RunConfig,
    model_dir: str | Path,
    init: str = "pretrained",
    out_dir: str | Path | None = None,
    log=_log,
) -> list[dict[str, Any]]:
    """Fine-tune `init` ('pretrained' or 'random') on every task and seed; returns one result per task (its
    `accuracy` is the mean over the seeds that did not collapse; `collapsed` names those that did)."""
    from core.run_layout import RunLayout

    ft = cfg.finetune
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir is not None else RunLayout(cfg).finetune
    tasks = load_tasks(cfg)  # every task read and checked before any model or tokenizer is loaded
    verify_export(model_dir)  # a local model folder holding the weights it recorded: nothing is looked up
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if any(t.pair for t in tasks):  # a tokenizer that cannot separate a pair is refused before any training
        frame_pair_task(tok, model_dir)
    results = []
    # a method with its own protocol (the frozen body's probes) saves no fine-tuned folder: `transfer` scores it
    methods = [m for m in ft.methods if ADAPT_METHODS.get(m).evaluate_arm is None]
    for data in tasks:
        task = prepare_task(ft, data, tok, model_dir)
        for method in methods:
            results.append(_finetune_method(task, data, init, method, out, log))
    return results


def _finetune_method(task, data, init: str, method: str, out: Path, log) -> dict[str, Any]:
    """One task with one method: the LR picked on dev (first seed), then every seed saved in its own folder
    (a LoRA folder holds the adapters and the head, loadable with peft's AutoPeftModel classes)."""
    ft = task.ft
    base = out / data.name / init if ADAPT_METHODS.get(method).primary else out / data.name / method / init
    grid = method_lr_grid(ft, method)
    lr = grid[0]
    if len(grid) > 1:
        sel = {
            x: task.fine_tune(init, x, ft.seeds[0], base / f"lr{x:g}-select", splits=("dev",), method=method)
            for x in grid
        }
        lr = pick_lr(
            grid,
            {x: r.accuracy["dev"] for x, r in sel.items()},
            {x: "dev" in r.collapsed for x, r in sel.items()},
        )
    by_seed, collapsed = {}, {}
    metric = task_metric(data.regression)
    for seed in ft.seeds:
        folder = base / f"seed{seed}"
        run = task.fine_tune(init, lr, seed, folder, save_model=True, method=method)
        by_seed[seed] = run.accuracy
        if "test" in run.collapsed:
            collapsed[seed] = run.collapsed["test"]
        log(
            f"[finetune] {data.name} {method} {init} seed {seed} lr {lr:g} ({ft.optim}): test {metric} "
            f"{run.accuracy['test']:.3f}"
            + (" COLLAPSED (one class)" if seed in collapsed else "")
            + f" -> {folder}"
        )
    kept = [a["test"] for s, a in by_seed.items() if s not in collapsed]
    return {
        "task": data.name,
        "init": init,
        "method": method,
        "lr": lr,
        "optim": ft.optim,
        "metric": metric,  # what `accuracy` holds: accuracy, or Pearson's r for regression
        "accuracy_by_seed": by_seed,
        "accuracy": sum(kept) / len(kept) if kept else None,
        "collapsed": collapsed,
        "labels": data.labels,
        **{f"{k}_examples": v for k, v in data.sizes().items()},
    }
