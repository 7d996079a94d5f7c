"""`python -m launch run` on one box: SIGTERM mid-run -> every rank checkpoints -> exit 75; rerun resumes."""

from __future__ import annotations

import os
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
    base = [
        sys.executable,
        "-m",
        "launch",
        "run",
        "--config",
        str(cfg_path),
        "launch.nodes=1",
        "launch.procs_per_node=2",
        "launch.master_port=29633",
        "checkpoint.every_steps=5",
    ]
    log = open(tmp_path / "first.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*base, "schedule.total_steps=400"], cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT
    )
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

    res = subprocess.run(
        [*base, f"schedule.total_steps={stopped + 3}"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert re.search(rf"resumed from \S+ at step {stopped}\b", res.stdout + res.stderr)
    assert max(_checkpoints(run)) == stopped + 3


def _tree(pid: int) -> list[int]:
    """Every descendant of `pid` (torchrun, its ranks in their own sessions, their loader workers)."""
    from core.process import children as _children

    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


@pytest.mark.timeout(900)
def test_sigkill_of_launch_run_takes_torchrun_and_the_ranks_down(prepared_run, tmp_path):
    """Issue 43 fault 6: a SIGKILLed `launch run` left torchrun and the ranks training; a rerun died in torch's
    EADDRINUSE traceback. Now torchrun gets a parent-death signal and shuts its ranks down; the rerun resumes."""
    from core.net import free_port

    cfg_path, run = training_run(tmp_path, "killed", prepared_run)
    base = [
        sys.executable,
        "-m",
        "launch",
        "run",
        "--config",
        str(cfg_path),
        "launch.nodes=1",
        "launch.procs_per_node=2",
        f"launch.master_port={free_port()}",
        "checkpoint.every_steps=5",
    ]
    log = open(tmp_path / "first.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*base, "schedule.total_steps=400"],
        cwd=ROOT,
        env=child_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    tree: list[int] = []
    try:
        metrics = run / "logs" / "metrics.jsonl"  # a line per step: the ranks are in the training loop
        deadline = time.monotonic() + 300
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not (metrics.is_file() and metrics.stat().st_size)
        ):
            time.sleep(0.5)
        assert metrics.is_file(), (tmp_path / "first.log").read_text()[-3000:]
        tree = _tree(proc.pid)
        assert len(tree) >= 3, tree  # torchrun and two ranks
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.5)
        left = [p for p in tree if _alive(p)]
        assert not left, (left, (tmp_path / "first.log").read_text()[-3000:])
        assert _checkpoints(run), (tmp_path / "first.log").read_text()[
            -3000:
        ]  # the ranks checkpointed at TERM
    finally:
        for p in [proc.pid, *tree]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        log.close()
    stopped = max(_checkpoints(run))
    res = subprocess.run(
        [*base, f"schedule.total_steps={stopped + 2}"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "EADDRINUSE" not in out, out[-3000:]
    assert re.search(rf"resumed from \S+ at step {stopped}\b", out), out[-3000:]
