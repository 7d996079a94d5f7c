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

from adapt.transfer import _log, pick_lr, prepare_task
from data_pipeline.labelled import load_tasks
from pretrain.export_folder import verify_export
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
    verify_export(model_dir)
    out = Path(out_dir) if out_dir is not None else RunLayout(cfg).finetune
    tasks = load_tasks(cfg)  # every task read and checked before any model or tokenizer is loaded
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    results = []
    for data in tasks:
        task = prepare_task(ft, data, tok, model_dir)
        lr = ft.lr_grid[0]
        if len(ft.lr_grid) > 1:
            sel = {
                x: task.fine_tune(
                    init, x, ft.seeds[0], out / data.name / init / f"lr{x:g}-select", splits=("dev",)
                )
                for x in ft.lr_grid
            }
            lr = pick_lr(
                ft.lr_grid,
                {x: r.accuracy["dev"] for x, r in sel.items()},
                {x: "dev" in r.collapsed for x, r in sel.items()},
            )
        by_seed, collapsed = {}, {}
        for seed in ft.seeds:
            folder = out / data.name / init / f"seed{seed}"
            run = task.fine_tune(init, lr, seed, folder, save_model=True)
            by_seed[seed] = run.accuracy
            if "test" in run.collapsed:
                collapsed[seed] = run.collapsed["test"]
            log(
                f"[finetune] {data.name} {init} seed {seed} lr {lr:g} ({ft.optim}): test accuracy {run.accuracy['test']:.3f}"
                + (" COLLAPSED (one class)" if seed in collapsed else "")
                + f" -> {folder}"
            )
        kept = [a["test"] for s, a in by_seed.items() if s not in collapsed]
        results.append(
            {
                "task": data.name,
                "init": init,
                "lr": lr,
                "optim": ft.optim,
                "accuracy_by_seed": by_seed,
                "accuracy": sum(kept) / len(kept) if kept else None,
                "collapsed": collapsed,
                "labels": data.labels,
                **{f"{k}_examples": v for k, v in data.sizes().items()},
            }
        )
    return results
