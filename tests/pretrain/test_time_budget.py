"""The time-budget schedule (schedule.budget_minutes) on the real engine, 2 ranks, ZeRO-2: a run ends within 2%
of its budget with the LR at its floor, and a run preempted half-way resumes at its checkpointed step with its
clock (the schedule continues, it does not restart), still ending on time."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from pretrain.checkpoint import PREEMPTED_EXIT_CODE, complete_tags
from tests.pretrain.conftest import start_training, torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420)]

BUDGET_MIN = 0.4  # 24 s of training
COMMON = [
    "schedule.total_steps=null",
    "schedule.warmup_steps=null",
    f"schedule.budget_minutes={BUDGET_MIN}",
    "schedule.warmup_fraction=0.1",
    "schedule.decay=linear",
    "schedule.min_lr_ratio=0.0",
    "deepspeed.zero_stage=2",
    "logging.every_steps=1",
    "eval.every_steps=100000",
    "eval.max_batches=1",
    "checkpoint.every_steps=5",
    "checkpoint.keep_last=2",
    "optim.lr=1e-3",
]


def _rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


def _result(stdout: str) -> dict:
    start = stdout.rindex('{\n "step"')
    return json.loads(stdout[start : stdout.index("\n}", start) + 2])


def test_budget_run_ends_on_time_with_lr_at_floor(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    res = torchrun(roberta_run, [out, *COMMON], timeout=600)
    result = _result(res.stdout)
    budget = BUDGET_MIN * 60
    assert result["budget_s"] == pytest.approx(budget)
    assert abs(result["elapsed_s"] - budget) <= 0.02 * budget, result
    rows = _rows(Path(out.split("=", 1)[1]))
    assert rows[-1]["lr"] <= 0.05 * 1e-3, rows[-1]  # decayed to (near) zero when the budget is spent
    peak = max(r["lr"] for r in rows)
    assert peak == pytest.approx(1e-3, rel=0.1)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(b["elapsed_s"] >= a["elapsed_s"] for a, b in zip(rows, rows[1:], strict=False))


def test_budget_clock_survives_preemption_and_resume(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    run_dir = Path(out.split("=", 1)[1])
    log = open(tmp_path / "first.log", "w")
    p = start_training(roberta_run, [out, *COMMON], log)
    deadline = time.time() + 300
    while time.time() < deadline and not complete_tags(run_dir / "checkpoints"):
        time.sleep(0.2)
    time.sleep(3.0)  # well inside the 24 s budget
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) in (PREEMPTED_EXIT_CODE, 1, -signal.SIGTERM), (
        tmp_path / "first.log"
    ).read_text()[-3000:]
    log.close()
    tag = complete_tags(run_dir / "checkpoints")[-1]
    stopped_at = int(tag[4:])
    before = [r for r in _rows(run_dir) if r["step"] <= stopped_at]
    clock_at_stop = before[-1]["elapsed_s"]
    assert 0 < clock_at_stop < BUDGET_MIN * 60

    res = torchrun(roberta_run, [out, *COMMON], timeout=600)
    assert f"resumed from {run_dir / 'checkpoints' / tag} at step {stopped_at}" in res.stdout
    after = [r for r in _rows(run_dir) if r["step"] > stopped_at]
    # continues at the checkpointed step, nothing replayed or skipped
    assert after[0]["step"] == stopped_at + 1
    assert after[0]["elapsed_s"] >= clock_at_stop  # the clock continues: the schedule does not restart warmup
    assert after[0]["lr"] <= before[-1]["lr"] + 1e-12
    result = _result(res.stdout)
    assert abs(result["elapsed_s"] - BUDGET_MIN * 60) <= 0.02 * BUDGET_MIN * 60, result
    assert after[-1]["lr"] <= 0.05 * 1e-3
