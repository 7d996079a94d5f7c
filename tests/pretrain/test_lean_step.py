"""The lean step's ds_config (issue 42, item 1): no throughput-timer syncs, no bf16 overflow scan (StepGuard skips a
bad step on the device instead), `overlap_comm` only where a reduction crosses ranks on an accelerator."""

from __future__ import annotations

import pytest

import pretrain.run.engine as E
from pretrain.run.schedule import make_plan
from runconfig import load_config

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("accelerator", ["cuda", "cpu"])
def test_ds_config_is_lean(monkeypatch, accelerator):
    monkeypatch.setattr(E, "accelerator_name", lambda: accelerator)  # the generator's input, not a component
    cfg = load_config("configs/demo.yaml", ["deepspeed.precision=bf16", "deepspeed.zero_stage=1"])
    one, two = (E.build_ds_config(cfg, make_plan(cfg, w)) for w in (1, 2))
    for conf in (one, two):
        assert conf["timers"]["throughput"]["enabled"] is False
        assert conf["wall_clock_breakdown"] is False
        assert conf["bf16"] == {"enabled": True, "check_grad_overflow": False}
    assert one["zero_optimization"]["overlap_comm"] is False  # a world of one has nothing to overlap
    assert two["zero_optimization"]["overlap_comm"] is (accelerator == "cuda")


# A world of one, DeepSpeed ZeRO-1 bf16 with our engine: the foreach gradient norm equals DeepSpeed's own per-tensor
# norm, a good step moves the weights, and a step flagged by the loop (a non-finite loss on some rank) or by a
# non-finite gradient norm leaves the fp32 master weights and AdamW's state exactly as they were.
ENGINE_DRIVER = r"""
import json, os, torch
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
from transformers import GPT2Config, GPT2LMHeadModel
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from runconfig import load_config
from pretrain.run.engine import build_engine, init_distributed
from pretrain.run.schedule import make_plan

cfg = load_config("configs/gpt2-tiny.yaml", ["deepspeed.precision=bf16", "deepspeed.zero_stage=1",
    "deepspeed.compile=false", "batch.global_batch_size=4", "batch.micro_batch_size=2", "launch.procs_per_node=1",
    "optim.grad_clip=0.01"])
init_distributed(cfg)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2))
engine, _, _ = build_engine(cfg, model, make_plan(cfg, 1))
opt, guard = engine.optimizer, engine.step_guard
ids = torch.randint(0, 128, (2, 32))

norms = []
lean_norm = opt.get_grad_norm_direct

def both_norms(grads, params, norm_type=2):  # ours returned, DeepSpeed's own recorded beside it
    ours = lean_norm(grads, params, norm_type)
    theirs = DeepSpeedZeroOptimizer.get_grad_norm_direct(opt, grads, params, norm_type)
    norms.append((float(ours), float(theirs)))
    return ours

opt.get_grad_norm_direct = both_norms

def step(scale, flag):
    for micro in range(engine.gradient_accumulation_steps()):
        engine.backward(engine(input_ids=ids, labels=ids).loss * scale)
        if micro < engine.gradient_accumulation_steps() - 1:
            engine.step()  # DeepSpeed counts micro-batches here; the optimizer runs at the last one
    norms.clear()
    guard.arm(torch.tensor(flag))
    before = [p.detach().clone() for p in opt.single_partition_of_fp32_groups]
    steps = [int(s["step"]) for s in opt.optimizer.state.values()]
    engine.step()
    after = opt.single_partition_of_fp32_groups
    moved = any(not torch.equal(a, b) for a, b in zip(after, before))
    return {"norms": list(norms), "moved": moved, "adam_steps": [steps, [int(s["step"]) for s in opt.optimizer.state.values()]],
            "finite": all(bool(torch.isfinite(p).all()) for p in after)}

out = [step(1.0, 0.0), step(1.0, 0.0), step(1.0, 1.0), step(float("nan"), 0.0), step(1.0, 0.0)]
print("LEAN " + json.dumps({"steps": out, "skipped": float(guard.skipped_steps())}))
"""


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(420)
def test_zero1_bf16_norm_matches_deepspeed_and_flagged_steps_are_skipped_on_device():
    import json
    import subprocess
    import sys

    from tests.pretrain.conftest import ROOT, child_env

    env = {
        k: v for k, v in child_env().items() if k not in ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["MASTER_PORT"] = str(__import__("core.net", fromlist=["free_port"]).free_port())
    res = subprocess.run(
        [sys.executable, "-c", ENGINE_DRIVER], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    r = json.loads(next(x for x in res.stdout.splitlines() if x.startswith("LEAN "))[5:])
    good, good2, flagged, nan_grads, after = r["steps"]
    for s in (good, good2, flagged, after):
        assert s["norms"]
        for ours, theirs in s["norms"]:
            assert ours == pytest.approx(theirs, rel=1e-5) and ours > 0
    assert all(
        ours == theirs == -1.0 for ours, theirs in nan_grads["norms"]
    )  # DeepSpeed's mark of a bad norm
    assert good["moved"] and good2["moved"] and after["moved"]
    assert not flagged["moved"] and flagged["adam_steps"][0] == flagged["adam_steps"][1]
    assert not nan_grads["moved"] and nan_grads["adam_steps"][0] == nan_grads["adam_steps"][1]
    assert all(s["finite"] for s in r["steps"])
    assert r["skipped"] == 2.0
