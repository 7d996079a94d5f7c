"""Resume at another world size (2 ranks -> 1 -> 2) through DeepSpeed's universal checkpoint, with the loader
continuing from the exact global sample position (the loader's own tests prove no sample is repeated or lost)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pretrain.checkpoint import complete_tags
from tests.pretrain.conftest import torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed]


def _client(ckpts: Path, tag: str) -> dict:
    return torch.load(ckpts / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)


def test_two_to_one_to_two_ranks(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    ckpts = Path(out.split("=", 1)[1]) / "checkpoints"
    torchrun(roberta_run, [out, "schedule.total_steps=8"], nproc=2)
    r1 = torchrun(roberta_run, [out, "schedule.total_steps=12"], nproc=1)
    assert "universal checkpoint" in r1.stdout and "resumed from" in r1.stdout and "step 8" in r1.stdout
    assert (ckpts / "step00000008_universal").is_dir()
    r2 = torchrun(roberta_run, [out, "schedule.total_steps=16"], nproc=2)
    assert "universal checkpoint" in r2.stdout and "step 12" in r2.stdout
    assert complete_tags(ckpts)[-1] == "step00000016"
    for step in (12, 16):
        state = _client(ckpts, f"step{step:08d}")
        assert state["loader"]["consumed_samples"] == step * 8  # global batch 8: continues exactly
        assert state["plan"]["world_size"] == (1 if step == 12 else 2)
        assert state["plan"]["grad_accum"] == (4 if step == 12 else 2)
