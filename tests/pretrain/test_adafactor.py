"""`optim.name: adafactor` (the T5 paper's optimizer, from transformers) trains on 2 ranks with ZeRO stage 0,
checkpoints its factored second moments and resumes from them exactly."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from pretrain.checkpoint import complete_tags
from tests.pretrain.conftest import torchrun
from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run, train_losses

pytestmark = [pytest.mark.deepspeed, pytest.mark.integration, pytest.mark.timeout(420)]

ADAFACTOR = ["optim.name=adafactor", "optim.lr=1.0e-2", "deepspeed.zero_stage=0"]


def test_adafactor_trains_checkpoints_and_resumes_exactly(tmp_path):
    config, out = prepare_smoke_run(tmp_path)
    torchrun(config, ADAFACTOR, timeout=200)
    ckpts = out / "checkpoints"
    assert complete_tags(ckpts) == ["step00000003", "step00000006"]
    straight = train_losses(out)
    assert sorted(straight) == [1, 2, 3, 4, 5, 6] and all(math.isfinite(x) for x in straight.values())
    assert straight[6] < straight[1], straight
    # ZeRO 0 in fp32: DeepSpeed clips the gradients but dropped the norm it computed, so every step logged 0
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    norms = [r["grad_norm"] for r in rows if r["split"] == "train"]
    assert len(norms) == 6 and all(math.isfinite(n) and n > 0 for n in norms), norms
    states = [
        torch.load(f, map_location="cpu", weights_only=False) for f in (ckpts / "step00000006").glob("*.pt")
    ]
    # factored second moments, as Adafactor keeps them for a matrix (AdamW's exp_avg_sq would be one full tensor)
    text = repr([s.get("optimizer") for s in states if isinstance(s, dict)])
    assert "exp_avg_sq_row" in text and "exp_avg_sq_col" in text

    # Back to step 3 as if the run had been killed after it, then resumed: steps 4-6 repeat exactly.
    shutil.rmtree(ckpts / "step00000006")
    (ckpts / "latest").write_text("step00000003")
    torchrun(config, ADAFACTOR, timeout=200)
    resumed = train_losses(out)
    assert complete_tags(ckpts)[-1] == "step00000006"
    assert [resumed[s] for s in (4, 5, 6)] == [straight[s] for s in (4, 5, 6)], (straight, resumed)
