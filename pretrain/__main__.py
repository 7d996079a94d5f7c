"""`python -m pretrain <command>`: train, export, card, plan, plot (finetune and transfer: `python -m adapt`)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from core.exit_codes import CANNOT_CONTINUE, PREEMPTED, USAGE
from core.layout import CLEAN_STATS, TOKEN_MANIFEST, RunPaths
from runconfig.cli import Command, config_from_args, dispatch, preflight, run_cli
from runconfig.run import RunConfig

RESET_HELP = (
    "resume with a new data order: when run.seed, the tokenizer, the data sources or the packing changed "
    "since the checkpoint, keep its weights, optimizer and step and start the loader afresh "
    "(= checkpoint.reset_data_order=true)"
)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _config(args: argparse.Namespace) -> RunConfig:
    if getattr(args, "reset_data_order", False):
        args.overrides = [*args.overrides, "checkpoint.reset_data_order=true"]
    return config_from_args(args)


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reset-data-order", action="store_true", help=RESET_HELP)


def _train(args: argparse.Namespace) -> int:
    # the config first: its loading routes third-party notices to the run's log before the imports below make any
    # (torchao's, which transformers imports where it is installed, come at import time)
    cfg = _config(args)
    import torch.distributed as dist

    from core.errors import CannotContinueError
    from core.preflight import check_tokens, check_train
    from pretrain.run import float8
    from pretrain.run.engine import accelerator_name, rank_device
    from pretrain.run.train import train
    from pretrain.run.watchdog import collective_failed
    from runconfig.init_from import check_run_tokenizer

    preflight(
        cfg,
        lambda c: check_train(c, accelerator_name()),
        lambda c: float8.check_device(c.model, rank_device()),
        check_run_tokenizer,
        check_tokens,
    )
    try:
        result = train(cfg)
    except CannotContinueError as e:  # a restart would fail the same way: a code Slurm does not requeue on
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"[train] {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        code = getattr(e, "exit_code", CANNOT_CONTINUE)  # a loss spike stop has its own (core/exit_codes.py)
    except Exception as e:
        collective_failed(e)  # a collective timeout: stacks dumped, the ranks behind named, exit HUNG
        # A failed rank (a dead peer's "Connection reset", a collective timeout, a bug) reports and ends at
        # once: CPython's teardown of a process holding torch, DeepSpeed and the model (a GC of the whole heap,
        # no Python frames left) took 17 s on a loaded 2-core machine, beyond 90 s under heavier load, and
        # torchrun ends the job only once this process is gone. Checkpoints are atomic and metrics.jsonl is
        # flushed per line, so nothing is lost by skipping it.
        sys.excepthook(*sys.exc_info())  # torch's hook: the traceback with its [rankN] prefix
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    else:
        if dist.get_rank() == 0:
            print(json.dumps(result, indent=1, default=str), flush=True)
        code = PREEMPTED if result["preempted"] else 0
    # A finished run and one that cannot continue (every rank decides alike, e.g. the run lock's broadcast) both
    # tear the group down: left to the interpreter's exit, its store threads were destroyed joinable and the
    # process sometimes died of SIGABRT ("terminate called without an active exception") instead of its code.
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint", default=None, help="a step folder or checkpoints folder (default: the run's)"
    )
    p.add_argument("--out", default=None, help="output folder (default: <run.output_dir>/export)")
    p.add_argument(
        "--merge-last", type=int, default=None, help="export the mean of the last K complete checkpoints"
    )


def _export(args: argparse.Namespace) -> int:
    from pretrain.export.folder import check_export_target

    cfg = _config(args)
    if not (args.out and "://" in args.out and not args.out.startswith("file://")):  # before torch loads
        check_export_target(
            args.out.removeprefix("file://") if args.out else RunPaths.from_config(cfg).export
        )
    from core.errors import CannotContinueError
    from pretrain.export.convert import export

    try:
        print(export(cfg, args.checkpoint, args.out, args.merge_last))
    except (CannotContinueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)  # one line naming the checkpoint / tokenizer / folder
        return CANNOT_CONTINUE
    return 0


def _card_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="exported folder (default: <run.output_dir>/export)")


def _card(args: argparse.Namespace) -> int:
    from core.run_layout import RunLayout
    from pretrain.export.model_card import write_model_card

    cfg = _config(args)
    if not args.model:
        layout = RunLayout(cfg)  # a remote run: its export (and what the card reads), fetched once
        layout.store.pull(
            [layout.export, layout.tokens / TOKEN_MANIFEST, layout.clean / CLEAN_STATS, layout.logs]
        )
    print(write_model_card(cfg, args.model or RunLayout(cfg).export))
    return 0


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--world-size", type=int, default=None, help="default: launch.nodes x launch.procs_per_node"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--gpu",
        default=None,
        help="GPU for the time estimate: h100 (default for an nccl config), h200, b200, a100, l40s, "
        "a10g, v100, mi300x (logging.peak_flops, when set, is used unless --gpu is given; a gloo (CPU) config "
        "gets no estimate without one of them)",
    )
    p.add_argument("--mfu", type=float, default=None, help="assumed model FLOPs utilisation (default 0.40)")
    p.add_argument(
        "--exact", action="store_true", help="count parameters on a meta-device build (imports torch)"
    )
    p.add_argument("--reset-data-order", action="store_true", help=RESET_HELP)


def _plan(args: argparse.Namespace) -> int:
    from core.errors import ConfigError
    from core.preflight import check_tokens, check_train
    from data_pipeline.readers.sources import check_source_paths
    from pretrain.tools.plan import (
        DEFAULT_MFU,
        check_plan_flags,
        expected_accelerator,
        format_report,
        plan_report,
    )
    from runconfig.init_from import check_run_tokenizer

    cfg = _config(args)
    check_plan_flags(cfg, args.world_size, args.gpu, args.mfu)
    # The checks `train` runs before any work, so a plan that prints is a run that starts. Token shards not
    # made yet are fine for a plan (it is how a run is sized before its data stages), their inputs are not.
    preflight(cfg, lambda c: check_train(c, expected_accelerator()), check_run_tokenizer)
    try:
        check_tokens(cfg)
        tokens_note = None
    except ConfigError as e:
        preflight(cfg, check_source_paths)
        tokens_note = str(e)

    r = plan_report(cfg, args.world_size, args.gpu, DEFAULT_MFU if args.mfu is None else args.mfu, args.exact)
    print(json.dumps(r, indent=1) if args.json else format_report(r))
    if tokens_note:
        print(f"note: {tokens_note}", file=sys.stderr)
    # what `train` would stop on: the same exit as a config error
    if (r.get("resume") or {}).get("error"):
        print(f"error: checkpoint.resume: {r['resume']['error']}", file=sys.stderr)
        return USAGE
    return 0


def _plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run folder (run.output_dir; a URL: plots are uploaded to RUN/logs/plots)")
    p.add_argument("--out", default=None, help="output folder (default: RUN/logs/plots)")


def _plot(args: argparse.Namespace) -> int:
    from pretrain.run.plots import plot_run

    # a remote run folder: never a local path
    if "://" in args.run and not args.run.startswith("file://"):
        import tempfile
        from pathlib import Path

        from core.storage import RunStore

        with tempfile.TemporaryDirectory(prefix="lmstack-plot-") as tmp:
            store = RunStore(Path(tmp), args.run.rstrip("/"))
            store.pull([RunPaths(tmp).logs])
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


def _decay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from", dest="from_step", type=int, required=True, help="a stable-phase checkpoint's step"
    )
    p.add_argument("--steps", type=int, required=True, help="the cool-down's length in steps")


def _decay(args: argparse.Namespace) -> int:
    """A WSD cool-down from a stable-phase checkpoint, trained as `train` is, in <run>/decay/step<S>+<N>."""
    from pretrain.tools.decay import prepare_branch

    args.overrides = [*args.overrides, *prepare_branch(config_from_args(args), args.from_step, args.steps)]
    args.reset_data_order = False
    return _train(args)


def _mixture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=8, help="proxy runs (at least 2 x sources + 2)")
    p.add_argument("--steps", type=int, default=None, help="steps per proxy run (default: the config's)")
    p.add_argument("--seed", type=int, default=0, help="the mixtures drawn")
    p.add_argument(
        "--max-epochs",
        type=float,
        default=4.0,
        help="passes over a source's training samples that no mixture exceeds in a run (default 4)",
    )


def _mixture(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pretrain.tools.mixture import format_table, run_mixture

    report = run_mixture(Path(args.config), args.overrides, args.runs, args.steps, args.seed, args.max_epochs)
    print(format_table(report))
    return 0


def _ladder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rungs", required=True, help="widths to train, WIDTH or WIDTHxLAYERS, e.g. 64,96,128,192"
    )
    p.add_argument("--tokens-per-param", type=float, default=20.0, help="tokens per non-embedding parameter")
    p.add_argument("--predict", default=None, help="rungs to predict, not trained (same form as --rungs)")
    p.add_argument("--memory-gib", type=float, default=None, help="memory of one rank (default: RAM / ranks)")
    from pretrain.tools.ladder import HPARAMS

    p.add_argument(
        "--hparams",
        choices=HPARAMS,
        default="scaled",
        help="scaled: each rung's batch x (N/N_config)^(2/3) and LR x (N/N_config)^(-1/3) (Porian et al. 2024); "
        "fixed: the config's batch and LR for every rung",
    )


def _ladder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pretrain.tools.ladder import format_table, run_ladder

    report = run_ladder(
        Path(args.config),
        args.overrides,
        args.rungs,
        args.tokens_per_param,
        args.predict,
        args.memory_gib,
        args.hparams,
    )
    print(format_table(report))
    print(f"plot: {report['plot']}", file=sys.stderr)
    return 0


COMMANDS = (
    Command("train", "pretrain through DeepSpeed (run under torchrun or `python -m launch run`)", _train, _train_args),
    Command("decay", "a warmup-stable-decay cool-down branch from a stable-phase checkpoint (RUN/decay/...); run "
            "it as train is run", _decay, _decay_args),
    Command("export", "checkpoint -> Hugging Face folder (safetensors, tokenizer, model card)", _export, _export_args),
    Command("card", "(re)write the export's Hub model card (e.g. after `python -m adapt transfer` wrote "
            "transfer.json)", _card, _card_args),
    Command("plan", "batch plan, scaled LR, token budget and ZeRO memory estimates", _plan, _plan_args),
    Command("mixture", "proxy runs at sampled data.sources weights, a fit of the held-out losses on the weights, "
            "the proposed mixture (RUN/mixture)", _mixture, _mixture_args),
    Command("ladder", "train the family at several widths on the same data, fit the loss against parameters "
            "and predict a bigger rung (RUN/ladder)", _ladder, _ladder_args),
    Command("plot", "loss (mixed, per source), perplexity, LR, throughput, MFU and probe curves as PNG "
            "(RUN/logs/plots)", _plot, _plot_args, config=False),
)  # fmt: skip


def _main(argv: list[str] | None = None) -> int:
    return dispatch("python -m pretrain", __doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
