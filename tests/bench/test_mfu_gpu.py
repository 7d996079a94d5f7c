"""bench/mfu_gpu.py runs unattended: its CPU smoke mode drives the GPU path's code (data stages, our trainer with
DeepSpeed ZeRO-1, bf16, activation checkpointing, MFU accounting) with tiny models on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.timeout(420)
@pytest.mark.deepspeed
def test_mfu_gpu_smoke_runs_on_cpu():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        [
            sys.executable,
            "bench/mfu_gpu.py",
            "--smoke",
            "--smoke-bf16",
            "--models",
            "gpt2_medium",
            "--zero",
            "1",
            "--ckpt",
            "on",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "SMOKE gpt2_medium 1 on: ran" in res.stdout
    assert "MFU gpt2_medium zero1 activation-checkpointing on" in res.stdout
    assert "VERDICT" not in res.stdout  # a smoke run is no result


def test_mfu_gpu_without_a_gpu_skips_cleanly():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        [sys.executable, "bench/mfu_gpu.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0 and res.stdout.startswith("SKIP mfu_gpu: no CUDA device")
