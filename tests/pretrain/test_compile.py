"""`deepspeed.compile`: torch.compile through DeepSpeed's `engine.compile()` (the GPU presets turn it on). On CPU
the test uses the `aot_eager` backend (no C++ toolchain needed): the compiled run must train the same losses as
the eager one, and its checkpoint and export keep the plain parameter names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pretrain.conftest import torchrun
from tests.pretrain.test_train_deepspeed import _export_and_check, isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(480)]


def _losses(out: str) -> list[float]:
    rows = [
        json.loads(x)
        for x in (Path(out.split("=", 1)[1]) / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    return [r["loss"] for r in rows if "loss" in r]


def test_compiled_engine_trains_like_eager_and_exports(gpt2_run, tmp_path):
    (tmp_path / "eager").mkdir()
    (tmp_path / "compiled").mkdir()
    eager = isolated(gpt2_run, tmp_path / "eager")
    compiled = isolated(gpt2_run, tmp_path / "compiled")
    common = ["schedule.total_steps=4", "model.dropout=0", "model.attention_dropout=0"]
    torchrun(gpt2_run, [eager, *common], nproc=1)
    res = torchrun(
        gpt2_run,
        [compiled, *common, "deepspeed.compile=true", "deepspeed.compile_backend=aot_eager"],
        nproc=1,
    )
    assert "torch.compile (aot_eager)" in res.stdout + res.stderr
    a, b = _losses(eager), _losses(compiled)
    assert len(a) == len(b) >= 2 and a == pytest.approx(b, rel=1e-4, abs=1e-5)
    info = _export_and_check(gpt2_run, compiled, "gpt2")  # parameter names without torch.compile's _orig_mod
    assert info["class"] == "GPT2LMHeadModel"
