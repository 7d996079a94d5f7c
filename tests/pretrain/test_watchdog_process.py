"""The hang procedure in one real process (a gloo world of one, torch's TCPStore, no DeepSpeed): a collective
timeout raised to the entry point, or a loop that stops making progress, ends in stack dumps, a report and exit
HUNG; any other error is left to the usual handler. The 2-rank runs are tests/pretrain/test_hang.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.exit_codes import HUNG
from core.net import free_port
from tests.pretrain.conftest import ROOT, child_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DRIVER = r"""
import os, sys, time
import torch, torch.distributed as dist
from pathlib import Path
from runconfig import load_config
from pretrain.run.watchdog import Watchdog, collective_failed

hang_dir, case = Path(sys.argv[1]), sys.argv[2]
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
dist.init_process_group("gloo")
cfg = load_config("configs/gpt2-tiny.yaml", ["deepspeed.comm_timeout_s=60", "watchdog.hang_timeout_s=2",
                                            "watchdog.heartbeat_s=0.2"])
model = torch.nn.Linear(4, 4)
dog = Watchdog.start(cfg, model, hang_dir)
for step in (1, 2, 3):
    dog.beat(step, "data")
    model(torch.ones(1, 4))
    dog.beat(step, "after")
collective_failed(RuntimeError("Connection reset by peer"))  # not a timeout: returns
print("RETURNED", flush=True)
if case == "timeout":
    collective_failed(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for recv"))
else:
    dog.beat(4, "data")
    model(torch.ones(1, 4))
    time.sleep(60)  # no progress: the watchdog thread ends the process
print("NOT REACHED", flush=True)
"""


@pytest.mark.parametrize("case", ["timeout", "no_progress"])
def test_the_hang_procedure_dumps_reports_and_exits_hung(tmp_path, case):
    hang = tmp_path / "logs" / "hang"
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, str(hang), case, str(free_port())],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert res.returncode == HUNG, res.stdout[-2000:] + res.stderr[-3000:]
    assert "RETURNED" in res.stdout and "NOT REACHED" not in res.stdout
    report = (hang / "report.txt").read_text()
    stacks = (hang / "rank-0.txt").read_text()
    if case == "timeout":
        assert "hang: rank 0: a collective timed out: [gloo" in report
        assert "in collective_failed" in stacks  # dumped from the main thread, where the error arrived
    else:
        assert "hang: rank 0 (host" in report and "made no progress for" in report and "at step 4" in report
        assert "step 4, in the backward/optimizer step of micro-batch 0" in report
        assert "in <module>" in stacks and "time.sleep" not in stacks  # faulthandler shows the line, not code
    assert "every rank reached the same point" in report  # a world of one: nobody behind
    assert "Thread 0x" in stacks and "MainThread" in stacks
    assert report.splitlines()[0] in res.stderr  # the log says it too
