"""`python -m data_pipeline <stage>`: each stage reads the run YAML and the previous stage's folder."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from core.errors import DiskFullError, is_disk_full
from core.preflight import check_output_writable
from core.run_layout import RunLayout
from data_pipeline.interrupt import StageInterrupted, stage_of, stop_signals
from data_pipeline.readers.sources import check_source_paths
from runconfig.cli import Command, config_from_args, dispatch, preflight, run_cli


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


def _stage_eval_tasks(cfg, args):
    from data_pipeline.eval_tasks import write_eval_tasks

    return write_eval_tasks(cfg)


def _stage_all(cfg, args):
    if cfg.data.executor != "local":  # every stage as tasks on that executor (e.g. a Ray cluster)
        from data_pipeline.stage_tasks import run_data_path

        return run_data_path(cfg)
    every = argparse.Namespace(shard_index=None, dedup_stage=None, task_index=None)
    return {
        "clean": _stage_clean(cfg, every),
        "dedup": _stage_dedup(cfg, every),
        "train-tokenizer": _stage_train_tokenizer(cfg, every),
        "tokenize": _stage_tokenize(cfg, every),
    }


def _disk_full_message(stage: str, cfg, e: BaseException) -> str:
    """One line: the file whose write failed and the free space of *its* filesystem (tokens/ or a stage folder
    may be a link to another disk than the run folder's), else of the stage's output folder."""
    layout = RunLayout(cfg)
    root = layout.root
    filename = _failed_file(e)
    outputs = {"clean": layout.clean, "dedup": layout.dedup, "tokenize": layout.tokens}
    probe = Path(filename) if filename else outputs.get(stage, root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.is_file():
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:.1f} MiB free on the filesystem of {probe}"
    except OSError:
        free = "free space unknown"
    where = f" writing {filename}" if filename else ""
    return (
        f"{stage}: the disk is full under {root}{where} ({free}); free space or set run.output_dir elsewhere, then "
        f"rerun `python -m data_pipeline {stage}`: finished shards are kept and nothing partial is marked done"
    )


def _failed_file(err: BaseException) -> str | None:
    """The file named by the error or by one in its cause/context chain (a worker's error is re-raised)."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if getattr(e, "filename", None):
            return str(e.filename)
        e = e.__cause__ or e.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    """Runs a stage; SIGINT / SIGTERM stop it with one line and exit 130 / 143 (data_pipeline/interrupt.py)."""
    try:
        with stop_signals():
            return run_cli(_main, argv)
    except StageInterrupted as e:
        stage = stage_of(argv)
        print(
            f"error: {stage}: stopped by {e.name}; finished shards are kept: rerun "
            f"`python -m data_pipeline {stage}` to finish",
            file=sys.stderr,
        )
        return e.exit_code


def _run_stage(name: str, stage) -> Callable[[argparse.Namespace], int]:
    """The command of one stage: load the config, check the machine, run the stage, print its report as JSON."""

    def run(args: argparse.Namespace) -> int:
        cfg = config_from_args(args)
        preflight(cfg, check_output_writable, *([check_source_paths] if name in ("clean", "all") else []))
        from data_pipeline.tokenizers.corpus import EmptyStageError

        try:
            result = stage(cfg, args)
        except EmptyStageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except Exception as e:
            if is_disk_full(e):
                raise DiskFullError(_disk_full_message(name, cfg, e)) from None
            raise
        print(json.dumps(result, indent=2, default=str))
        return 0

    return run


def _shard_index(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shard-index", type=int, default=None, help="process only this input shard (Slurm array task)"
    )


def _dedup_task(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stage",
        dest="dedup_stage",
        default=None,
        help="run one task of this dedup stage (a Slurm array task)",
    )
    p.add_argument("--task-index", type=int, default=None, help="which task of --stage")


COMMANDS = (
    Command(
        "clean",
        "read sources, extract text, apply cleaning filters, write cleaned shards",
        _run_stage("clean", _stage_clean),
        _shard_index,
    ),
    Command(
        "dedup",
        "exact + MinHash-LSH near-dedup across all cleaned shards (sharded stages; "
        "--stage S --task-index I runs one task)",
        _run_stage("dedup", _stage_dedup),
        _dedup_task,
    ),
    Command(
        "train-tokenizer",
        "train the configured tokenizer on the deduplicated corpus",
        _run_stage("train-tokenizer", _stage_train_tokenizer),
    ),
    Command(
        "tokenize",
        "cleaned shards -> binary token shards + manifest",
        _run_stage("tokenize", _stage_tokenize),
        _shard_index,
    ),
    Command("all", "clean, dedup, train-tokenizer and tokenize in order", _run_stage("all", _stage_all)),
    Command(
        "eval-tasks",
        "lm-evaluation-harness tasks (choice, cloze, perplexity) from the fine-tune tasks' "
        "held-out splits, into <run>/eval_tasks",
        _run_stage("eval-tasks", _stage_eval_tasks),
    ),
)


def _main(argv: list[str] | None = None) -> int:
    return dispatch("python -m data_pipeline", __doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
