"""bench/gpu.py runs unattended: its CPU smoke mode drives the GPU slot's whole path (data stages, our trainer with the
GPU preset and regional compile, the plain PyTorch peer loop, the profile table, and for the Llama our trainer with
model.float8 through torchao's emulation, its first-step time and held-out loss beside bf16's) with tiny models on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_gpu_bench_smoke_runs_on_cpu():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        [sys.executable, "bench/gpu.py", "--smoke", "--configs", "gpt2_medium_accum4", "llama_1b"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "SMOKE gpt2_medium_accum4: ran (ours, peer)" in res.stdout
    assert "SMOKE llama_1b: ran (ours, peer, fp8)" in res.stdout
    assert "[llama_1b] our FP8 trainer's profile, 2 steps:" in res.stdout
    assert (
        "[llama_1b] FP8 (tensorwise)" in res.stdout
        and "held-out loss after the same steps: FP8 " in res.stdout
    )
    assert "first step (compilation included) ours " in res.stdout
    for name in ("gpt2_medium_accum4", "llama_1b"):
        assert f"[{name}] peer profile, 2 steps:" in res.stdout
        assert f"[{name}] our trainer's profile, 2 steps:" in res.stdout
    assert "host reads of tensors" in res.stdout  # our trainer's own profiler summary
    assert "VERDICT" not in res.stdout  # a smoke run is no result


def test_gpu_bench_without_a_gpu_skips_cleanly():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        [sys.executable, "bench/gpu.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0 and res.stdout.startswith("SKIP gpu: no CUDA device")
