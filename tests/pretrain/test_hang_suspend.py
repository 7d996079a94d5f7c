"""A suspended job is not a hung job; a stopped rank is named where it was (issue 64, item 3).

Two gloo ranks with the real DeepSpeed engine:
- the whole job (torchrun and both ranks) is stopped with SIGSTOP for longer than `watchdog.hang_timeout_s`, as
  `scontrol suspend`, gang scheduling or Ctrl-Z do, then continued: the run goes on to its last step, exits 0 and
  leaves no hang report;
- one rank stops itself with SIGSTOP inside step 3's forward (the test callback tests/pretrain/steering.py `Delay`,
  "1:3:stop") while the other waits for it in the step's reduction: the report names that rank as dead or frozen at step 3 (not the
  reporting rank, not the step of a heartbeat written earlier), and the run ends within the hang limit plus the
  grace of pretrain/run/watchdog.py (`hang_grace_s`), not after torchrun's 30 s SIGTERM-to-SIGKILL wait."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from core.exit_codes import HUNG
from pretrain.run.watchdog import hang_grace_s
from tests.pretrain import steering
from tests.pretrain.conftest import ROOT, child_env, train_command
from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420)]

LIMIT_S = 6.0  # watchdog.hang_timeout_s
BEAT_S = 1.0  # watchdog.heartbeat_s
COMMON = [
    "deepspeed.comm_timeout_s=120",
    f"watchdog.hang_timeout_s={LIMIT_S}",
    f"watchdog.heartbeat_s={BEAT_S}",
    "checkpoint.every_steps=1000",
    "logging.every_steps=1",
    "eval.every_steps=1000",
]


def _start(config: Path, overrides: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """torchrun and its ranks in a session of their own, the output to `log_path`."""
    return subprocess.Popen(
        train_command(config, overrides),
        cwd=ROOT,
        env=env,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_for(what, timeout: float, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"not seen (rc {proc.poll()})\n{log_path.read_text()[-6000:]}")
        time.sleep(0.05)


def _train_steps(out: Path) -> list[int]:
    metrics = out / "logs" / "metrics.jsonl"
    if not metrics.is_file():
        return []
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip().endswith("}")]
    return [r["step"] for r in rows if r["split"] == "train"]


def _job(proc: subprocess.Popen) -> list[psutil.Process]:
    """torchrun and every process under it: its ranks run in process groups of their own."""
    top = psutil.Process(proc.pid)
    return [top, *top.children(recursive=True)]


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        _signal(_job(proc), signal.SIGKILL)  # SIGKILL ends stopped processes too
        proc.wait()


def test_a_whole_job_suspended_past_the_hang_limit_goes_on_and_finishes(tmp_path):
    config, out = prepare_smoke_run(tmp_path)
    log_path = tmp_path / "train.log"
    # every step at least 0.2 s (a test-only delay in each rank's forward): the stop lands well inside the run
    delay = steering.override(Delay={"delays": ["0:*:0.2", "1:*:0.2"]})
    proc = _start(config, [*COMMON, "schedule.total_steps=40", delay], log_path, child_env())
    try:
        _wait_for(lambda: len(_train_steps(out)) >= 3, 240, proc, log_path)
        job = _job(proc)
        _signal(job, signal.SIGSTOP)  # torchrun and both ranks, as scontrol suspend does
        stopped_at = max(_train_steps(out))
        time.sleep(LIMIT_S + 6)
        assert max(_train_steps(out)) == stopped_at  # nothing ran meanwhile
        _signal(job, signal.SIGCONT)
        rc = proc.wait(timeout=240)
    finally:
        _kill(proc)
    log = log_path.read_text()
    assert stopped_at < 40 and len(job) >= 3, (stopped_at, job)  # suspended mid-run: torchrun and 2 ranks
    assert rc == 0, log[-6000:]
    assert _train_steps(out) == list(range(1, 41))
    hang = out / "logs" / "hang"
    assert not (hang / "report.txt").exists(), (hang / "report.txt").read_text()
    assert not list(hang.glob("rank-*.txt")) and f"exitcode : {HUNG}" not in log
    # the suspension was seen, and said, rather than missed
    assert re.search(r"was not running for \d+ s \(suspended", log), log[-6000:]
    assert (out / "checkpoints" / "latest").read_text() == "step00000040"


def test_one_rank_stopped_is_named_at_its_step_and_the_run_ends_within_the_grace(tmp_path):
    config, out = prepare_smoke_run(tmp_path)
    log_path = tmp_path / "train.log"
    delay = steering.override(Delay={"delays": ["1:3:stop"]})
    proc = _start(config, [*COMMON, "schedule.total_steps=40", delay], log_path, child_env())
    try:
        _wait_for(lambda: "stops itself (SIGSTOP)" in log_path.read_text(), 240, proc, log_path)
        stopped = time.monotonic()
        rc = proc.wait(timeout=120)
        ended_after = time.monotonic() - stopped
    finally:
        _kill(proc)
    log = log_path.read_text()
    assert rc != 0 and re.search(rf"exitcode\s*:\s*{HUNG}\b", log), log[-6000:]
    report = (out / "logs" / "hang" / "report.txt").read_text()
    host = socket.gethostname()
    assert f"ranks that did not arrive: rank 1 (host {host}): heartbeat silent" in report, report
    assert "dead or frozen" in report and "stopped" in report, report
    assert "step 3, in the forward of micro-batch 0" in report.split("where each rank is:")[0], report
    assert "rank 0 (host" not in report.split("where each rank is:")[0].split("\n", 1)[1], report
    assert (out / "logs" / "hang" / "rank-0.txt").is_file()
    # the limit, plus the stated grace, plus a margin for a loaded 2-core machine (torchrun's teardown included);
    # before the fix: limit + a 3-heartbeat wait + torchrun's 30 s before SIGKILL of the stopped rank
    budget = LIMIT_S + hang_grace_s(BEAT_S) + 8
    assert ended_after < budget, f"ended {ended_after:.0f} s after the stop (budget {budget:.0f} s)\n{report}"
