"""Attention on SDPA's fast path in the compiled training step (issue 42, item 3): for the causal families on
unpadded packed batches every `scaled_dot_product_attention` call gets no mask and `is_causal=True`, and Llama's
grouped-query attention passes `enable_gqa=True` instead of repeating K and V. With document masking on, every
call gets the per-document mask instead (correct, and the documented cost: no flash kernel).

Checked in the installed transformers and in 5.17, the version on the GPU machines, which builds a [B,1,T,T] mask
whenever dynamo traces the mask creation (a side venv layered on this one, built once from PyPI). The graphs are
read by a recording dynamo backend (tests/pretrain/sdpa_trace.py); one graph serves every block
(`compile_blocks`), which is what keeps the first compile short.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.pretrain.sdpa_trace import trace

ROOT = Path(__file__).resolve().parents[2]
GPU_TRANSFORMERS = "5.17.0"


def _check(res: dict, family: str, document_masking: bool) -> None:
    assert res["blocks"] == 2 and res["graphs"] == 1, res  # one graph for both blocks
    assert res["calls"], res
    if document_masking:
        assert "position_ids" in res["batch_keys"]
        assert all(c["mask"] and not c["is_causal"] for c in res["calls"]), res
    else:
        assert "attention_mask" not in res["batch_keys"]
        gqa = family == "llama"  # llama-tiny: 4 query heads share 2 key/value heads
        assert all(not c["mask"] and c["is_causal"] and c["enable_gqa"] == gqa for c in res["calls"]), res
    assert res["grads"] and res["loss"] == pytest.approx(res["eager_loss"], rel=1e-5)


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family,document_masking", [("gpt2", False), ("llama", False), ("llama", True)])
def test_compiled_step_calls_sdpa_causal_without_mask(family, document_masking):
    _check(trace(family, document_masking), family, document_masking)


@pytest.mark.integration
@pytest.mark.compat
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_step_calls_sdpa_causal_without_mask_in_transformers_5_17():
    from launch.side_venv import ensure_venv

    probe = f"import torch, transformers; assert transformers.__version__ == '{GPU_TRANSFORMERS}'"
    python = ensure_venv(
        ROOT / ".venv-compat-tf517", [f"transformers=={GPU_TRANSFORMERS}"], probe=probe, layered=True
    )
    for family, document_masking in [("gpt2", False), ("llama", False), ("gpt2", True)]:
        run = subprocess.run(
            [str(python), str(ROOT / "tests/pretrain/sdpa_trace.py"), family, str(int(document_masking))],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            timeout=400,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        res = json.loads(run.stdout.strip().splitlines()[-1])
        assert res["transformers"] == GPU_TRANSFORMERS
        _check(res, family, document_masking)
