"""Resume outside the happy path, with the real engine: damaged checkpoints, a missing RNG file, config changes,
non-finite weights and a run folder in use (issue 12, items 1-5)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.checkpoint import CANNOT_CONTINUE_EXIT_CODE, complete_tags
from pretrain.run.run_lock import LOCK_NAME
from pretrain.run.schedule import WarmupDecay
from tests.pretrain.conftest import run_module, torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420)]
BASE = [
    "checkpoint.every_steps=4",
    "checkpoint.keep_last=3",
    "eval.every_steps=1000",
    "logging.every_steps=1",
]


def _train_1rank(config: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    """`python -m pretrain train` without torchrun (a world of one): its own exit code is visible."""
    return run_module(["-m", "pretrain", "train", "--config", str(config), *overrides], check=False)


def _lrs(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in rows if r["split"] == "train"}


@pytest.mark.timeout(480)
def test_damaged_checkpoints_fall_back_then_stop_without_requeue(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    run = Path(out.split("=", 1)[1])
    ckpts = run / "checkpoints"
    torchrun(roberta_run, [out, *BASE, "schedule.total_steps=12"])
    assert complete_tags(ckpts) == ["step00000004", "step00000008", "step00000012"]

    # Two kinds of damage, one restart: truncated model states in the newest checkpoint, and a missing per-rank
    # RNG file in the one before (it used to give a silently inexact resume). Both are skipped with a warning
    # naming the file; the run resumes from the newest undamaged checkpoint.
    states = ckpts / "step00000012" / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[:1000])
    (ckpts / "step00000008" / "rng_rank00001.pt").unlink()
    res = torchrun(roberta_run, [out, *BASE, "schedule.total_steps=12"])
    text = res.stdout + res.stderr
    assert (
        "skipping damaged checkpoint" in text
        and "step00000012: mp_rank_00_model_states.pt: 1000 bytes" in text
    )
    assert "step00000008: rng_rank00001.pt: missing" in text
    assert f"resumed from {ckpts / 'step00000004'} at step 4" in text
    assert complete_tags(ckpts) == ["step00000004", "step00000008", "step00000012"]

    # every checkpoint damaged (optimizer shards zeroed, one deleted): a clear stop, a code Slurm never requeues
    for tag, name in (
        ("step00000004", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
        ("step00000008", "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
        ("step00000012", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ):
        shard = ckpts / tag / name
        shard.write_bytes(bytes(shard.stat().st_size))
    (ckpts / "step00000008" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    res = _train_1rank(roberta_run, [out, *BASE, "schedule.total_steps=12"])
    assert res.returncode == CANNOT_CONTINUE_EXIT_CODE != 75, res.stderr[-3000:]
    assert "no usable checkpoint left" in res.stderr and "checksum differs" in res.stderr
    assert "Traceback" not in res.stderr


def test_config_changes_on_resume_are_applied_or_refused(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    run = Path(out.split("=", 1)[1])
    common = [out, *BASE, "schedule.warmup_steps=2", "checkpoint.every_steps=8"]
    torchrun(roberta_run, [*common, "schedule.total_steps=8"])
    assert _lrs(run)[8] == 0.0  # the end of an 8-step linear decay

    refused = torchrun(
        roberta_run, [*common, "schedule.total_steps=12", "batch.global_batch_size=16"], check=False
    )
    assert refused.returncode != 0 and "batch.global_batch_size: checkpoint 8, now 16" in refused.stderr
    assert "checkpoint.accept_config_changes=true" in refused.stderr

    res = torchrun(roberta_run, [*common, "schedule.total_steps=12", "optim.lr=5e-4"])
    assert "schedule.total_steps: 8 -> 12" in res.stdout and "optim.lr: 0.001 -> 0.0005" in res.stdout
    lrs, sched = _lrs(run), WarmupDecay(2, 12, "linear", 0.0)
    for step in range(9, 13):  # the logged LR after step s is the schedule at s: longer run, new peak
        assert lrs[step] == pytest.approx(5e-4 * sched(step)), (step, lrs)
    assert lrs[9] > 0


def test_nonfinite_weights_are_never_checkpointed(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    ckpts = Path(out.split("=", 1)[1]) / "checkpoints"
    # A finite config whose first update overflows fp32: AdamW's decoupled decay multiplies the weights by
    # 1 - lr x weight_decay = -3e39. Step 1's loss is finite (computed before the update); its weights are not.
    res = _train_1rank(
        roberta_run,
        [
            out,
            *BASE,
            "optim.lr=3e37",
            "optim.weight_decay=100",
            "schedule.warmup_steps=0",
            "schedule.total_steps=3",
            "checkpoint.every_steps=1",
        ],
    )
    assert res.returncode == CANNOT_CONTINUE_EXIT_CODE, res.stderr[-3000:]
    assert "the weights after step 1 are not finite" in res.stderr
    assert "last good checkpoint: none" in res.stderr
    assert complete_tags(ckpts) == [] and not list(ckpts.glob("step*"))


def test_second_run_on_the_same_folder_stops_before_any_work(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    run = Path(out.split("=", 1)[1])
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run / LOCK_NAME).write_text(
            json.dumps(
                {"host": socket.gethostname(), "pid": holder.pid, "started": "earlier", "proc_start": None}
            )
        )
        res = _train_1rank(roberta_run, [out, *BASE, "schedule.total_steps=4"])
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == CANNOT_CONTINUE_EXIT_CODE, res.stderr[-3000:]
    assert f"in use by another training run: host {socket.gethostname()} pid {holder.pid}" in res.stderr
    # no work: no checkpoints, no metrics; logs/ holds at most third_party.log (import-time notices of libraries,
    # e.g. torchao's when transformers imports it, routed there once the config is loaded)
    assert not (run / "checkpoints").exists()
    assert not (run / "logs").exists() or [p.name for p in (run / "logs").iterdir()] == ["third_party.log"]
    # the holder has exited: its lock is stale, the next run takes it over, trains and releases it
    res = _train_1rank(roberta_run, [out, *BASE, "schedule.total_steps=4"])
    assert res.returncode == 0 and "took over a stale lock" in res.stdout, res.stderr[-3000:]
    assert not (run / LOCK_NAME).exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="needs root to mount a small tmpfs as a full disk",
)
def test_disk_full_names_the_path_and_removes_the_partial_folder(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    ckpts = Path(out.split("=", 1)[1]) / "checkpoints"
    torchrun(roberta_run, [out, *BASE, "schedule.total_steps=4"], nproc=1)
    size = sum(f.stat().st_size for f in (ckpts / "step00000004").iterdir())
    small = tmp_path / "small"
    small.mkdir()
    # room for the copied step-4 checkpoint and half of another one
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size * 1.5) + (64 << 10)}", "tmpfs", str(small)],
        check=True,
    )
    try:
        shutil.copytree(ckpts / "step00000004", small / "step00000004")
        (small / "latest").write_text("step00000004")
        res = _train_1rank(roberta_run, [out, *BASE, "schedule.total_steps=8", f"checkpoint.dir={small}"])
        assert res.returncode == CANNOT_CONTINUE_EXIT_CODE, res.stderr[-3000:]
        msg = res.stderr
        assert f"saving checkpoint {small / 'step00000008'} failed: the disk is full" in msg, msg[-3000:]
        assert "MiB free on the filesystem of" in msg and "last good checkpoint: step00000004" in msg
        # DeepSpeed copies its recovery scripts beside every checkpoint it saves (they are in any checkpoints folder)
        ds_scripts = ("zero_to_fp32.py", "zero_to_torch.py")
        left = sorted(p.name for p in small.iterdir() if p.name not in ds_scripts)
        assert left == ["latest", "resolved_config.yaml", "step00000004"]
        assert complete_tags(small) == ["step00000004"]
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.mark.timeout(420)
def test_a_latest_write_cut_by_a_kill_leaves_no_temp_after_the_next_start(roberta_run, tmp_path):
    """The soak's kill during the `latest` pointer's atomic write left `checkpoints/.latest.*.tmp` for good
    (CI, session 13): the next run, once it holds the run lock, removes it."""
    out = isolated(roberta_run, tmp_path)
    ckpts = Path(out.split("=", 1)[1]) / "checkpoints"
    torchrun(roberta_run, [out, *BASE, "schedule.total_steps=2"], nproc=1)
    cut = ckpts / ".latest.abc123.tmp"
    cut.write_text("step0000")
    torchrun(roberta_run, [out, *BASE, "schedule.total_steps=4"], nproc=1)
    assert not cut.exists() and (ckpts / "latest").read_text() == "step00000004"
