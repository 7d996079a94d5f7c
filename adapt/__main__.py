"""`python -m adapt <command>`: finetune, transfer (the downstream floor, above pretrain)."""

from __future__ import annotations

import argparse
import sys

from core.layout import CLEAN_STATS, TOKEN_MANIFEST
from runconfig.cli import add_config_args, config_from_args, run_cli


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("finetune", help="sequence-classification fine-tune of an export; prints accuracy")
    add_config_args(p)
    p.add_argument("--model", default=None, help="exported folder (default: <run.output_dir>/export)")
    p.add_argument("--init", choices=["pretrained", "random", "both"], default="both")
    p = sub.add_parser(
        "transfer", help="pretrained export vs random init (HF Trainer, LR per arm, seeds, probe)"
    )
    add_config_args(p)
    p.add_argument("--model", default=None, help="exported folder (default: <run.output_dir>/export)")
    p.add_argument("--out", default=None, help="output folder (default: <run.output_dir>/finetune)")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)

    from core.run_layout import RunLayout

    if not args.model:
        layout = RunLayout(cfg)  # a remote run: its export (and what the card reads), fetched once
        layout.store.pull(
            [layout.export, layout.tokens / TOKEN_MANIFEST, layout.clean / CLEAN_STATS, layout.logs]
        )
    if args.command == "finetune":
        from adapt.finetune import finetune

        model_dir = args.model or str(RunLayout(cfg).export)
        inits = ["pretrained", "random"] if args.init == "both" else [args.init]
        results = [r for init in inits for r in finetune(cfg, model_dir, init, RunLayout(cfg).finetune)]
        for r in results:
            acc = "collapsed" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
            bad = f", collapsed seeds {sorted(r['collapsed'])} left out" if r["collapsed"] else ""
            print(
                f"{r['task']}: {r['init']:>10}: accuracy {acc} (mean of {len(r['accuracy_by_seed'])} "
                f"seeds{bad}) on {r['test_examples']} test examples"
            )
        return 0
    from adapt.transfer import format_report, run_transfer

    report = run_transfer(cfg, args.model or RunLayout(cfg).export, args.out)
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
