"""The watchdog in one real process (a gloo world of one, torch's TCPStore, no DeepSpeed) across a SIGSTOP of the
process itself, and the freshness of its heartbeat (issue 64, item 3). The 2-rank runs are
tests/pretrain/test_hang_suspend.py.

The driver's loop waits for a line on stdin inside step 3's forward, as a rank waits in a collective for a peer:
the test stops the process (SIGSTOP) for longer than the hang limit, continues it, and sends the line a moment
later, as the peer would answer once the job runs again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from core.exit_codes import HUNG
from core.net import free_port
from pretrain.run.watchdog import Suspensions
from tests.pretrain.conftest import ROOT, child_env

DRIVER = r"""
import json, os, sys, time
import torch, torch.distributed as dist
from pathlib import Path
from runconfig import load_config
from pretrain.run.watchdog import Watchdog

hang_dir, case, beat_s = Path(sys.argv[1]), sys.argv[2], sys.argv[4]
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
dist.init_process_group("gloo")
cfg = load_config("configs/gpt2-tiny.yaml", ["deepspeed.comm_timeout_s=60", "watchdog.hang_timeout_s=2",
                                            f"watchdog.heartbeat_s={beat_s}"])
model = torch.nn.Linear(4, 4)
dog = Watchdog.start(cfg, model, hang_dir)
store = dist.distributed_c10d._get_default_store()
for step in (1, 2, 3):
    dog.beat(step, "data")
    model(torch.ones(1, 4))
    if case == "fresh" and step == 3:
        time.sleep(1.0)  # well within a 5 s heartbeat period
        print("STORE", store.get(dog.prefix + "hb/0").decode(), flush=True)
    dog.beat(step, "after")
dog.beat(4, "data")
model(torch.ones(1, 4))
print("WAITING", flush=True)
sys.stdin.readline()  # no progress until the test answers
dog.beat(4, "after")
dog.stop()
print("DONE", flush=True)
"""

pytestmark = pytest.mark.timeout(30)


def _driver(tmp_path, case: str, beat_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path / "hang"), case, str(free_port()), str(beat_s)],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_line(proc: subprocess.Popen, text: str) -> list[str]:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(text):
            return seen
    raise AssertionError(f"no {text!r}: rc {proc.wait()}\n{''.join(seen)}\n{proc.stderr.read()[-3000:]}")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_process_stopped_past_the_hang_limit_is_not_hung(tmp_path):
    proc = _driver(tmp_path, "suspend", 0.2)
    try:
        _wait_line(proc, "WAITING")
        time.sleep(0.1)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(6)  # three times the 2 s limit
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.5)  # the "peer" answers a moment after the job runs again: still within the limit
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert "DONE" in out and not (tmp_path / "hang" / "report.txt").exists(), err[-3000:]
    assert "was not running for 6 s (suspended" in err, err[-3000:]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_stopped_process_that_stays_without_progress_is_still_hung(tmp_path):
    """The time stopped is left out, the time waiting after it is not: 2 s after SIGCONT the limit is reached."""
    proc = _driver(tmp_path, "suspend", 0.2)
    try:
        _wait_line(proc, "WAITING")
        proc.send_signal(signal.SIGSTOP)
        time.sleep(4)
        proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        proc.wait(timeout=60)  # never answered (stdin stays open)
        after = time.monotonic() - resumed
        out, err = proc.communicate()
    finally:
        proc.kill()
    assert proc.returncode == HUNG, out[-2000:] + err[-3000:]
    assert "made no progress for" in (tmp_path / "hang" / "report.txt").read_text()
    # the limit counted from SIGCONT on (before: the watchdog fired within a heartbeat, 0.2 s, of SIGCONT)
    assert 0.9 < after < 15, after


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_heartbeat_in_the_store_follows_the_loop_within_a_heartbeat_period(tmp_path):
    """A rank stopped between two heartbeats is found where it was, not where it was one period earlier."""
    proc = _driver(tmp_path, "fresh", 5.0)
    try:
        lines = _wait_line(proc, "STORE")
    finally:
        proc.kill()
        proc.wait()
    beat = json.loads(lines[-1][len("STORE ") :])
    assert (beat["step"], beat["phase"]) == (3, "backward"), beat


def test_time_stopped_is_left_out_of_the_idle_time():
    """Pure accounting: a wake-up 30 s late with no CPU used is a suspension; one late while the process burned
    CPU (the main thread holding the interpreter) or barely late is not."""
    s = Suspensions(floor_s=1.0)
    assert s.observe(start=100.0, end=100.5, asked_s=0.5, cpu_s=0.0) == 0.0
    assert s.observe(start=100.5, end=131.0, asked_s=0.5, cpu_s=0.01) == pytest.approx(30.0)
    assert s.idle(since=99.0, now=131.5) == pytest.approx(32.5 - 30.0)
    assert s.idle(since=130.9, now=131.5) == pytest.approx(0.6 - 0.1)  # only the part after `since` counts
    assert s.idle(since=131.2, now=131.5) == pytest.approx(0.3)  # progress after the wake-up: none off
    assert s.observe(start=131.0, end=141.5, asked_s=0.5, cpu_s=9.0) == 0.0  # busy, not stopped
    assert s.observe(start=141.5, end=142.6, asked_s=0.5, cpu_s=0.0) == 0.0  # below the floor
    assert s.idle(since=99.0, now=142.6) == pytest.approx(43.6 - 30.0)
    s.forget_before(135.0)
    assert s.idle(since=136.0, now=142.6) == pytest.approx(6.6)
