"""A DeepSpeed start on CPU never waits on torch's JIT-extension lock.

DeepSpeed built its CPU shared-memory op at every init under a file lock in the extensions folder; a rank
SIGKILLed while holding it (a chaos kill, a dead host, scancel) left the lock behind, and every later start on the
machine waited forever in FileBaton.wait with no output (seen while the netns and chaos tests ran side by side)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.pretrain.conftest import ROOT, child_env, train_command, world_of_one
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420)]


def test_training_starts_despite_a_stale_extension_lock(roberta_run, tmp_path):
    ext = tmp_path / "torch_extensions"
    (ext / "deepspeed_shm_comm").mkdir(parents=True)
    (ext / "deepspeed_shm_comm" / "lock").touch()  # what a rank killed inside the JIT build leaves behind
    overrides = ["schedule.total_steps=2", "checkpoint.every_steps=2", "eval.every_steps=1000"]
    cmd = train_command(roberta_run, [isolated(roberta_run, tmp_path), *overrides])
    t0 = time.monotonic()
    try:
        res = subprocess.run(
            cmd,
            cwd=ROOT,
            env={**child_env(), "TORCH_EXTENSIONS_DIR": str(ext)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"training did not finish in 300 s with a stale lock in {ext}:\n{(e.stdout or b'')[-3000:]!r}"
        )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (ext / "deepspeed_shm_comm" / "lock").exists()  # never touched: the op is not built at all
    print(f"2 ranks trained 2 steps in {time.monotonic() - t0:.0f} s beside a stale extension lock")


# A world of one with AdamW, ZeRO-2 and compile off: what each rank imports to start and take a step. DeepSpeed 0.19
# imports its Muon module at every ZeRO start and reduction, and Muon's @torch.compile decorators loaded torch's
# inductor at import: 1.6 s of CPU per rank at every start, for an optimizer no run uses.
START_DRIVER = r"""
from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

moved = any(not torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
inner = type(engine.optimizer.optimizer)
print("RESULT " + json.dumps({"inductor": "torch._inductor.compile_fx" in sys.modules, "moved": moved,
    "muon": "deepspeed.runtime.zero.muon.muon_optimizer" in sys.modules,
    "optimizer": inner.__name__, "listed": inner in ZERO_SUPPORTED_OPTIMIZERS}))
"""


def test_a_zero_start_with_adamw_does_not_load_the_compiler():
    got = world_of_one(START_DRIVER)
    # Muon's module is imported (DeepSpeed's isinstance tests need it), its kernels eager
    assert got == {"inductor": False, "moved": True, "muon": True, "optimizer": "AdamW", "listed": True}, got
