"""`python -m data_pipeline <stage>`: each stage reads the run YAML and the previous stage's folder."""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from core.errors import DiskFullError, is_disk_full
from core.preflight import check_output_writable
from core.run_layout import RunLayout
from data_pipeline.interrupt import StageInterrupted, stage_of, stop_signals
from data_pipeline.readers.sources import check_source_paths
from runconfig.cli import add_config_args, config_from_args, preflight, run_cli


def _stage_clean(cfg, args):
    from data_pipeline.clean import run_clean

    return run_clean(cfg, shard_index=args.shard_index)


def _stage_dedup(cfg, args):
    from data_pipeline.dedup import run_dedup, run_dedup_task

    if args.dedup_stage is not None:
        if args.task_index is None:
            raise SystemExit("error: --stage needs --task-index (one task of that stage)")
        return run_dedup_task(cfg, args.dedup_stage, args.task_index, cfg.data.task_retries)
    return run_dedup(cfg)


def _stage_train_tokenizer(cfg, args):
    from data_pipeline.tokenizers import train_tokenizer

    return {"tokenizer": str(train_tokenizer(cfg))}


def _stage_tokenize(cfg, args):
    from data_pipeline.tokenize import run_tokenize

    return run_tokenize(cfg, shard_index=args.shard_index)


def _stage_all(cfg, args):
    if cfg.data.executor != "local":  # every stage as tasks on that executor (e.g. a Ray cluster)
        from data_pipeline.stage_tasks import run_data_path

        return run_data_path(cfg)
    out = {}
    for name in ("clean", "dedup", "train-tokenizer", "tokenize"):
        out[name] = STAGES[name][0](
            cfg, argparse.Namespace(shard_index=None, dedup_stage=None, task_index=None)
        )
    return out


STAGES = {
    "clean": (_stage_clean, "read sources, extract text, apply cleaning filters, write cleaned shards"),
    "dedup": (
        _stage_dedup,
        "exact + MinHash-LSH near-dedup across all cleaned shards (sharded stages; "
        "--stage S --task-index I runs one task)",
    ),
    "train-tokenizer": (_stage_train_tokenizer, "train the configured tokenizer on the deduplicated corpus"),
    "tokenize": (_stage_tokenize, "cleaned shards -> binary token shards + manifest"),
    "all": (_stage_all, "clean, dedup, train-tokenizer and tokenize in order"),
}


def _disk_full_message(stage: str, cfg, e: BaseException) -> str:
    root = RunLayout(cfg).root
    try:
        free = f"{shutil.disk_usage(root).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
    return (
        f"{stage}: the disk is full under {root}{where} ({free}); free space or set run.output_dir elsewhere, then "
        f"rerun `python -m data_pipeline {stage}`: finished shards are kept and nothing partial is marked done"
    )


def main(argv: list[str] | None = None) -> int:
    """Runs a stage; SIGINT / SIGTERM stop it with one line and exit 130 / 143 (data_pipeline/interrupt.py)."""
    try:
        with stop_signals():
            return run_cli(_main, argv)
    except StageInterrupted as e:
        stage = stage_of(argv)
        print(f"error: {stage}: stopped by {e.name}; finished shards are kept: rerun "
              f"`python -m data_pipeline {stage}` to finish", file=sys.stderr)  # fmt: skip
        return e.exit_code


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="stage", required=True)
    for name, (_, help_) in STAGES.items():
        p = sub.add_parser(name, help=help_, description=help_)
        add_config_args(p)
        if name in ("clean", "tokenize"):
            p.add_argument(
                "--shard-index",
                type=int,
                default=None,
                help="process only this input shard (Slurm array task)",
            )
        if name == "dedup":
            p.add_argument(
                "--stage",
                dest="dedup_stage",
                default=None,
                help="run one task of this dedup stage (a Slurm array task)",
            )
            p.add_argument("--task-index", type=int, default=None, help="which task of --stage")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    preflight(cfg, check_output_writable, *([check_source_paths] if args.stage in ("clean", "all") else []))
    from data_pipeline.tokenizers.corpus import EmptyStageError

    try:
        result = STAGES[args.stage][0](cfg, args)
    except EmptyStageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        if is_disk_full(e):
            raise DiskFullError(_disk_full_message(args.stage, cfg, e)) from None
        raise
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
