"""Exactness under failure: a ZeRO-2 run on 2 ranks that is SIGKILLed at random moments (one of them while a
checkpoint is being written) and restarted until done ends with the same weights, bit for bit, as an
uninterrupted run of the same length."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from pretrain.checkpoint import complete_tags
from pretrain.export.convert import consolidated_state_dict
from tests.pretrain.conftest import saving_now, sigkill, start_training, torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(720)]

STEPS = 24
OVERRIDES = [
    f"schedule.total_steps={STEPS}",
    "checkpoint.every_steps=3",
    "checkpoint.keep_last=2",
    "eval.every_steps=8",
    "logging.every_steps=1",
    "loader.num_workers=1",
]


def _kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL torchrun and every rank at once, as a node crash would."""
    sigkill([psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)])
    p.wait(timeout=30)


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpts = run_dir / "checkpoints"
    tag = complete_tags(ckpts)[-1]
    assert tag == f"step{STEPS:08d}"
    return consolidated_state_dict(ckpts, tag)


# Train rows: the values that follow from the weights, data and schedule alone (not the clock).
TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens_seen")


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


def _trace_differences(ref_dir: Path, got_dir: Path) -> list[str]:
    """Every row the killed run logged (also those of steps it redid after a kill) against the reference's row of
    the same step and split: loss, LR, gradient norm and tokens for training rows, the loss for eval rows."""
    ref = {(r["split"], r["step"]): r for r in _rows(ref_dir)}
    got = _rows(got_dir)
    assert {(r["split"], r["step"]) for r in got} == set(ref), "the killed run logged other steps"
    diffs = []
    for r in got:
        want = ref[(r["split"], r["step"])]
        for key in TRAIN_KEYS if r["split"] == "train" else ("loss",):
            if r[key] != want[key]:
                diffs.append(f"{r['split']} step {r['step']} {key}: {r[key]!r} != {want[key]!r}")
    return diffs


# Every family but RoBERTa, which takes its SIGKILLs in tests/pretrain/test_chaos.py (20 of them, 3+
# mid-checkpoint, 2 single-rank). T5 with its default dropout 0.1: the resumed dropout masks must match too.
@pytest.mark.parametrize("family", ["modernbert", "electra", "t5", "gpt2", "llama"])
def test_sigkill_anywhere_then_resume_is_bit_exact(family, request, tmp_path):
    run_config = request.getfixturevalue(f"{family}_run")
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    ref_dir.mkdir()
    kill_dir.mkdir()
    ref_out = isolated(run_config, ref_dir)
    torchrun(run_config, [ref_out, *OVERRIDES], timeout=600)

    out = isolated(run_config, kill_dir)
    ckpt_dir = Path(out.split("=", 1)[1]) / "checkpoints"
    rng = random.Random(20261121)
    kills: list[str] = []
    log = open(tmp_path / "killed.log", "w")
    # Kill 1: while the second checkpoint is being written. Kill 2: a random moment within half a second of the
    # restarted run's first new complete checkpoint, so the restart really resumes mid-run and the last start
    # resumes a resumed run (a wider window let a fast family, ModernBERT's tiny run, finish all 24 steps before
    # the second kill). The chaos test puts 20 kills into one RoBERTa run; here each family gets the two kinds.
    while len(kills) < 2:
        before = set(complete_tags(ckpt_dir))
        p = start_training(run_config, [out, *OVERRIDES], log)
        t0, kill_at = time.time(), None
        while p.poll() is None:
            done_now = set(complete_tags(ckpt_dir)) - before
            if not kills and done_now and saving_now(ckpt_dir):
                _kill_tree(p)
                kills.append(f"mid-checkpoint after {sorted(done_now)}")
            elif kills and done_now and kill_at is None:
                kill_at = time.time() + rng.uniform(0.0, 0.5)
            elif kill_at is not None and time.time() >= kill_at:
                _kill_tree(p)
                kills.append(f"random at {time.time() - t0:.1f}s, complete: {complete_tags(ckpt_dir)}")
            time.sleep(0.005)
        if p.returncode == 0:
            break  # finished before the second kill: the assertion on the kills below names it
    p = start_training(run_config, [out, *OVERRIDES], log)
    assert p.wait(timeout=600) == 0, (tmp_path / "killed.log").read_text()[-4000:]
    log.close()
    assert len(kills) == 2 and kills[0].startswith("mid-checkpoint"), kills
    text = (tmp_path / "killed.log").read_text()
    assert text.count("resumed from") >= len(kills), text[-3000:]

    ref, got = _final_weights(ref_dir / "run"), _final_weights(kill_dir / "run")
    assert ref.keys() == got.keys()
    different = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not different, f"after kills {kills}: {len(different)} tensors differ, e.g. {different[:3]}"
    diffs = _trace_differences(ref_dir / "run", kill_dir / "run")
    assert not diffs, f"{family} after kills {kills}: the loss trace differs: {diffs[:5]}"
