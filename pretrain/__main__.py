"""`python -m pretrain <command>`: train, export, card, finetune, transfer, plan, plot."""

from __future__ import annotations

import argparse
import json
import os
import sys

from runconfig.cli import add_config_args, config_from_args, preflight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pretrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="pretrain through DeepSpeed (run under torchrun or `python -m launch run`)")
    add_config_args(p)
    p = sub.add_parser("export", help="checkpoint -> Hugging Face folder (safetensors, tokenizer, model card)")
    add_config_args(p)
    p.add_argument("--checkpoint", default=None, help="a step folder or checkpoints folder (default: the run's)")
    p.add_argument("--out", default=None, help="output folder (default: <run.output_dir>/export)")
    p = sub.add_parser("finetune", help="sequence-classification fine-tune of an export; prints accuracy")
    add_config_args(p)
    p.add_argument("--model", default=None, help="exported folder (default: <run.output_dir>/export)")
    p.add_argument("--init", choices=["pretrained", "random", "both"], default="both")
    p = sub.add_parser("transfer", help="pretrained export vs random init (HF Trainer, LR per arm, seeds, probe)")
    add_config_args(p)
    p.add_argument("--model", default=None, help="exported folder (default: <run.output_dir>/export)")
    p.add_argument("--out", default=None, help="output folder (default: <run.output_dir>/finetune)")
    p = sub.add_parser("card", help="(re)write the export's Hub model card (e.g. after `transfer` wrote transfer.json)")
    add_config_args(p)
    p.add_argument("--model", default=None, help="exported folder (default: <run.output_dir>/export)")
    p = sub.add_parser("plan", help="batch plan, scaled LR, token budget and ZeRO memory estimates")
    add_config_args(p)
    p.add_argument("--world-size", type=int, default=None, help="default: launch.nodes x launch.procs_per_node")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("plot", help="loss, perplexity, LR, throughput and MFU curves as PNG (RUN/logs/plots)")
    p.add_argument("run", help="the run folder (run.output_dir; a URL: plots are uploaded to RUN/logs/plots)")
    p.add_argument("--out", default=None, help="output folder (default: RUN/logs/plots)")
    args = parser.parse_args(argv)
    if args.command == "plot":
        from pretrain.plots import plot_run

        if "://" in args.run and not args.run.startswith("file://"):  # a remote run folder: never a local path
            import tempfile
            from pathlib import Path

            from data_pipeline.storage import RunStore

            with tempfile.TemporaryDirectory(prefix="lmstack-plot-") as tmp:
                store = RunStore(Path(tmp), args.run.rstrip("/"))
                store.pull([Path(tmp) / "logs"])
                paths = plot_run(tmp, args.out)
                if args.out is None:
                    store.push(paths)
                    paths = [store.url(p) for p in paths]
                for path in paths:
                    print(path)
            return 0
        for path in plot_run(args.run.removeprefix("file://"), args.out):
            print(path)
        return 0
    cfg = config_from_args(args)

    if args.command == "train":
        import torch.distributed as dist

        from pretrain.checkpoint import CANNOT_CONTINUE_EXIT_CODE, PREEMPTED_EXIT_CODE, CannotContinue
        from pretrain.engine import accelerator_name
        from pretrain.train import train
        from runconfig.preflight import check_train

        preflight(cfg, lambda c: check_train(c, accelerator_name()))

        try:
            result = train(cfg)
        except CannotContinue as e:  # a restart would fail the same way: a code Slurm does not requeue on
            if not dist.is_initialized() or dist.get_rank() == 0:
                print(f"[train] {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return CANNOT_CONTINUE_EXIT_CODE
        except Exception:
            # A failed rank (a dead peer's "Connection reset", a collective timeout, a bug) reports and ends at
            # once: CPython's teardown of a process holding torch, DeepSpeed and the model (a GC of the whole heap,
            # no Python frames left) took 17 s on a loaded 2-core machine, beyond 90 s under heavier load, and
            # torchrun ends the job only once this process is gone. Checkpoints are atomic and metrics.jsonl is
            # flushed per line, so nothing is lost by skipping it.
            sys.excepthook(*sys.exc_info())  # torch's hook: the traceback with its [rankN] prefix
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        if dist.get_rank() == 0:
            print(json.dumps(result, indent=1, default=str), flush=True)
        dist.destroy_process_group()
        return PREEMPTED_EXIT_CODE if result["preempted"] else 0
    if args.command == "export":
        from pretrain.export import export

        print(export(cfg, args.checkpoint, args.out))
        return 0
    if args.command in ("finetune", "transfer", "card") and not args.model:
        from data_pipeline.layout import RunLayout

        layout = RunLayout(cfg)  # a remote run: its export (and what the card reads), fetched once
        layout.store.pull([layout.export, layout.tokens / "manifest.json", layout.clean / "stats.json", layout.logs])
    if args.command == "finetune":
        from data_pipeline.layout import RunLayout
        from pretrain.finetune import finetune

        model_dir = args.model or str(RunLayout(cfg).export)
        inits = ["pretrained", "random"] if args.init == "both" else [args.init]
        results = [r for init in inits for r in finetune(cfg, model_dir, init, RunLayout(cfg).finetune)]
        for r in results:
            acc = "collapsed" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
            bad = f", collapsed seeds {sorted(r['collapsed'])} left out" if r["collapsed"] else ""
            print(f"{r['task']}: {r['init']:>10}: accuracy {acc} (mean of {len(r['accuracy_by_seed'])} "
                  f"seeds{bad}) on {r['test_examples']} test examples")
        return 0
    if args.command == "transfer":
        from data_pipeline.layout import RunLayout
        from pretrain.transfer import format_report, run_transfer

        report = run_transfer(cfg, args.model or RunLayout(cfg).export, args.out)
        print(format_report(report))
        return 0
    if args.command == "card":
        from data_pipeline.layout import RunLayout
        from pretrain.model_card import write_model_card

        print(write_model_card(cfg, args.model or RunLayout(cfg).export))
        return 0
    if args.command == "plan":
        from pretrain.plan import format_report, plan_report

        r = plan_report(cfg, args.world_size)
        print(json.dumps(r, indent=1) if args.json else format_report(r))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
