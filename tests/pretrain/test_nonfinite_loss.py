"""A diverging run: non-finite losses are skipped (zero gradient contribution, same collectives on every rank),
and after K consecutive bad steps training halts with a clear message, the last good checkpoint untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain.checkpoint import complete_tags
from tests.pretrain.conftest import torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420)]


def test_consecutive_nonfinite_steps_halt_keeping_last_good_checkpoint(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    ckpts = Path(out.split("=", 1)[1]) / "checkpoints"
    # An absurd LR overflows fp32 activations within a couple of steps: loss becomes inf/NaN.
    res = torchrun(
        roberta_run,
        [
            out,
            "optim.lr=1e30",
            "schedule.warmup_steps=0",
            "schedule.total_steps=30",
            "checkpoint.every_steps=1",
            "checkpoint.keep_last=50",
            "deepspeed.max_consecutive_bad_steps=3",
            "eval.every_steps=1000",
        ],
        check=False,
    )
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "TrainingHalted" in text and "3 consecutive steps with non-finite loss" in text
    tags = complete_tags(ckpts)
    assert tags, "the good steps before divergence were checkpointed"
    last_good = tags[-1]
    assert f"last good checkpoint: {last_good}" in text
    halted_at = int(text.split("non-finite loss at step ")[1].split(";")[0])
    assert int(last_good[4:]) == halted_at - 3  # nothing written during the bad streak
    assert not [d for d in ckpts.iterdir() if d.name.startswith("step") and d.name not in tags]
