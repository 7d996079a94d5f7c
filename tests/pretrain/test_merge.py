"""`python -m pretrain export --merge-last K`: the mean of the last K complete checkpoints, equal to a hand
average of their consolidated weights under ZeRO-2 and ZeRO-3, exported with parity and named in the card."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from core.errors import ConfigError
from pretrain.export.merge import merged_state_dict, tags_to_merge
from tests.pretrain.conftest import ROOT, child_env, torchrun


@pytest.mark.timeout(60)
def test_the_mean_and_the_tags(tmp_path):
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([1.5])}
    m = merged_state_dict(["s1", "s2"], {"s1": a, "s2": b}.__getitem__)
    assert torch.equal(m["w"], torch.tensor([2.0, 4.0])) and torch.equal(m["b"], torch.tensor([1.0]))
    tags = ["step00000003", "step00000006", "step00000009"]
    assert tags_to_merge(tags, "step00000009", 2, tmp_path) == tags[1:]
    assert tags_to_merge(tags, "step00000006", 2, tmp_path) == tags[:2]
    with pytest.raises(
        ConfigError, match=r"--merge-last 3: .* holds 2 complete checkpoint\(s\) up to step00000006"
    ):
        tags_to_merge(tags, "step00000006", 3, tmp_path)
    with pytest.raises(ConfigError, match="not hold the same tensors"):
        merged_state_dict(["s1", "s2"], {"s1": a, "s2": {"w": b["w"]}}.__getitem__)


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("zero", [2, 3])
def test_a_merged_export_is_the_hand_average(tmp_path, zero):
    from transformers import AutoModelForCausalLM

    from pretrain.export.convert import consolidated_state_dict
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

    config, out = prepare_smoke_run(tmp_path)
    torchrun(config, [f"deepspeed.zero_stage={zero}"], timeout=300)
    ckpts = out / "checkpoints"
    hand = {}
    for tag in ("step00000003", "step00000006"):
        for k, v in consolidated_state_dict(ckpts, tag).items():
            hand[k] = hand.get(k, 0) + v.double() / 2
    folder = tmp_path / "merged"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain",
            "export",
            "--config",
            str(config),
            "--merge-last",
            "2",
            "--out",
            str(folder),
            f"deepspeed.zero_stage={zero}",
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(folder)
    got = model.state_dict()
    compared = 0
    for k, v in hand.items():
        name = k.removeprefix("module.")
        if name in got:
            torch.testing.assert_close(got[name].float(), v.float(), rtol=0, atol=1e-7)
            compared += 1
    assert compared >= len(got) - 2  # every tensor but a tied head / buffers
    state = json.loads((folder / "training_state.json").read_text())
    assert state["merged_from"] == ["step00000003", "step00000006"]
    assert state["parity_max_abs_diff"] is None or state["parity_max_abs_diff"] < 1e-5
    assert "mean of 2 checkpoints' (step00000003, step00000006)" in (folder / "README.md").read_text()
