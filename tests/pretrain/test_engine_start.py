"""A DeepSpeed start on CPU never waits on torch's JIT-extension lock.

DeepSpeed built its CPU shared-memory op at every init under a file lock in the extensions folder; a rank
SIGKILLed while holding it (a chaos kill, a dead host, scancel) left the lock behind, and every later start on the
machine waited forever in FileBaton.wait with no output (seen while the netns and chaos tests ran side by side)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.pretrain.conftest import ROOT, child_env, train_command
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
