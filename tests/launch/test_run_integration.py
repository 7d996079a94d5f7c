"""`python -m launch run` on one box: SIGTERM mid-run -> every rank checkpoints -> exit 75; rerun resumes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from tests.launch.conftest import ROOT, child_env, training_run

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420)]


def _checkpoints(run) -> list[int]:
    return sorted(int(p.name[4:]) for p in (run / "checkpoints").glob("step*") if (p / "COMPLETE").exists())


def test_run_sigterm_checkpoints_exits_75_and_resumes(prepared_run, tmp_path):
    cfg_path, run = training_run(tmp_path, "box", prepared_run)
    base = [sys.executable, "-m", "launch", "run", "--config", str(cfg_path), "launch.nodes=1",
            "launch.procs_per_node=2", "launch.master_port=29633", "checkpoint.every_steps=5"]  # fmt: skip
    log = open(tmp_path / "first.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([*base, "schedule.total_steps=400"], cwd=ROOT, env=child_env(), stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _checkpoints(run) and proc.poll() is None:
            time.sleep(0.5)
        assert _checkpoints(run), (tmp_path / "first.log").read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "first.log").read_text()
    assert rc == 75, out[-3000:]
    stopped = max(_checkpoints(run))
    assert stopped < 400 and re.search(r'"preempted": true', out), out[-3000:]

    res = subprocess.run([*base, f"schedule.total_steps={stopped + 3}"], cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert re.search(rf"resumed from \S+ at step {stopped}\b", res.stdout + res.stderr)
    assert max(_checkpoints(run)) == stopped + 3
