"""`python -m adapt <command>`: finetune, transfer, continue, evaluate (the downstream floor, above pretrain)."""

from __future__ import annotations

import argparse
import os
import sys

from core.layout import CLEAN_STATS, TOKEN_MANIFEST
from core.run_layout import RunLayout
from runconfig.cli import Command, config_from_args, dispatch, run_cli
from runconfig.run import RunConfig


def main(argv: list[str] | None = None) -> int:
    # lmstack never downloads at run time: a model name that is no local folder must not become a hub lookup
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_cli(_main, argv)


def _export_dir(cfg: RunConfig, model: str | None) -> str:
    """The export to adapt: `--model`, or the run's export (a remote run's fetched once, with what the card reads)."""
    if model:
        return model
    layout = RunLayout(cfg)
    layout.store.pull(
        [layout.export, layout.tokens / TOKEN_MANIFEST, layout.clean / CLEAN_STATS, layout.logs]
    )
    return str(layout.export)


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="exported folder (default: <run.output_dir>/export)")


def _finetune_args(p: argparse.ArgumentParser) -> None:
    _model_arg(p)
    p.add_argument("--init", choices=["pretrained", "random", "both"], default="both")


def _finetune(args: argparse.Namespace) -> int:
    from adapt.finetune import finetune
    from adapt.report import metric_text, seeds_text

    cfg = config_from_args(args)
    model_dir = _export_dir(cfg, args.model)
    inits = ["pretrained", "random"] if args.init == "both" else [args.init]
    results = [r for init in inits for r in finetune(cfg, model_dir, init, RunLayout(cfg).finetune)]
    for r in results:
        acc = "collapsed" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
        bad = f", collapsed seeds {sorted(r['collapsed'])} left out" if r["collapsed"] else ""
        print(
            f"{r['task']}: {r['method']}/{r['init']}: {metric_text(r)} {acc} (mean of "
            f"{seeds_text(len(r['accuracy_by_seed']))}{bad}) on {r['test_examples']} test examples"
        )
    return 0


def _transfer_args(p: argparse.ArgumentParser) -> None:
    _model_arg(p)
    p.add_argument("--out", default=None, help="output folder (default: <run.output_dir>/finetune)")


def _transfer(args: argparse.Namespace) -> int:
    from adapt.report import format_report
    from adapt.transfer import run_transfer

    cfg = config_from_args(args)
    print(format_report(run_transfer(cfg, _export_dir(cfg, args.model), args.out)))
    return 0


def _continue_args(p: argparse.ArgumentParser) -> None:
    _transfer_args(p)
    p.add_argument(
        "--steps", type=int, default=None, help="continued-pretraining steps (default: schedule's)"
    )


def _continue(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adapt.continued import run_continue
    from adapt.report import format_report

    cfg = config_from_args(args)
    out = Path(args.out) if args.out else RunLayout(cfg).finetune
    print(format_report(run_continue(cfg, Path(_export_dir(cfg, args.model)), out, args.steps)))
    return 0


def _evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="an exported causal LM folder (from_pretrained)")
    p.add_argument(
        "--tasks", required=True, help="comma-separated harness task names or tags (lmstack: all local)"
    )
    p.add_argument(
        "--tasks-dir", default=None, help="local task YAMLs (default: <run>/eval_tasks beside the export)"
    )
    p.add_argument("--limit", type=float, default=None, help="examples per task (a fraction if below 1)")
    p.add_argument(
        "--num-fewshot", type=int, default=None, help="few-shot examples (from a task's dev split)"
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:0 (default: cuda when there is one)")
    p.add_argument("--out", default=None, help="where the results go (default: the model folder)")


def _evaluate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adapt.evaluate import evaluate

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    tasks_dir = Path(args.tasks_dir) if args.tasks_dir else None
    out = Path(args.out) if args.out else None
    res = evaluate(
        Path(args.model), tasks, tasks_dir, args.limit, args.num_fewshot, args.batch_size, args.device, out
    )
    if res:
        print(res["table"])
        print(
            f"written: {res['written']}; `python -m pretrain card --config C` puts them in the card",
            file=sys.stderr,
        )
    return 0


COMMANDS = (
    Command(
        "finetune",
        "fine-tune an export on each task; prints its test metric (accuracy, or Pearson r for a "
        "regression task)",
        _finetune,
        _finetune_args,
    ),
    Command(
        "transfer",
        "pretrained export vs random init (HF Trainer, LR per arm, seeds, probe)",
        _transfer,
        _transfer_args,
    ),
    Command(
        "continue",
        "ULMFiT: continue the export on the tasks' training text, fine-tune, report beside it",
        _continue,
        _continue_args,
    ),
    Command(
        "evaluate",
        "score a causal export with lm-evaluation-harness (local tasks: data_pipeline eval-tasks)",
        _evaluate,
        _evaluate_args,
        config=False,
    ),
)


def _main(argv: list[str] | None = None) -> int:
    return dispatch("python -m adapt", __doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
