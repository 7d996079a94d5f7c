"""Hangs and stragglers named (issue 44 items 3-4), on 2 gloo ranks with the real DeepSpeed engine.

One run serves both tests: a test callback (tests/pretrain/steering.py `Delay`, registered on the run as an
outside plug-in) makes rank 1 a
second slower than rank 0 in the forward of every step (a straggler), then fall asleep inside step 3's forward for
far longer than any timeout (a hang)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from core.exit_codes import HUNG
from tests.pretrain import steering
from tests.pretrain.conftest import torchrun
from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

# one worker runs the module: its two tests read the same hung run (a module fixture), built once, not per worker
pytestmark = [
    pytest.mark.integration,
    pytest.mark.deepspeed,
    pytest.mark.timeout(420),
    pytest.mark.xdist_group("hang"),
]


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    config, out = prepare_smoke_run(tmp_path_factory.mktemp("hang"))
    delay = steering.override(Delay={"delays": ["1:*:1.0", "1:3:600"]})
    res = torchrun(
        config,
        [
            "deepspeed.comm_timeout_s=120",
            "watchdog.hang_timeout_s=6",
            "watchdog.heartbeat_s=0.5",
            "watchdog.straggler_factor=1.3",
            "checkpoint.every_steps=1000",
            "logging.every_steps=1",
            delay,
        ],
        timeout=300,
        check=False,
    )
    return res, out


def test_a_rank_asleep_inside_a_step_is_named_and_every_rank_dumps_its_stacks(hung_run):
    res, out = hung_run
    log = res.stdout + res.stderr
    assert res.returncode != 0, log[-3000:]
    # the ranks ended with the named code (torchrun's failure summary names the first to end)
    assert re.search(rf"exitcode\s*:\s*{HUNG}\b", log), log[-4000:]
    # a rank whose collective broke when a peer ended after its report goes through the report too, not a
    # traceback of gloo's "Connection closed by peer"
    assert not re.search(r"^\[rank\d\]: Traceback", log, re.M), log[-4000:]

    host = socket.gethostname()
    hang = out / "logs" / "hang"
    report = (hang / "report.txt").read_text()
    assert (
        f"ranks that did not arrive: rank 1 (host {host}): step 3, in the forward of micro-batch 0" in report
    )
    assert "rank 0 (host" in report and "did not arrive: rank 0" not in report
    assert f"did not arrive: rank 1 (host {host})" in log  # and every rank's log says it
    stacks = {r: (hang / f"rank-{r}.txt").read_text() for r in (0, 1)}
    assert "_forward_begins" in stacks[1]  # the sleeping rank's main thread, caught where it sleeps
    assert "MainThread" in stacks[0] and "lmstack-watchdog" in stacks[0]  # every thread, named in the header
    assert "in _train" in stacks[0]  # rank 0's main thread, waiting in the step's reduction
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]
    # named within the hang limit and a few heartbeats of the last step, not at the collective timeout (120 s)
    assert (hang / "report.txt").stat().st_mtime - rows[-1]["time"] < 60


def test_a_slow_rank_is_named_with_its_host_and_counted_in_the_metrics(hung_run):
    res, out = hung_run
    log = res.stdout + res.stderr
    host = socket.gethostname()
    # step 2 (step 1 carries each rank's first-use costs too)
    assert f"straggler at step 2: rank 1 (host {host})" in log, log[-3000:]
    assert "rank 0 (host" not in "".join(x for x in log.splitlines() if "straggler at step" in x)
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in rows if r["split"] == "train"}
    assert all(r["step_time_max_rank"] == 1 for r in train.values()), train
    r = train[2]
    assert r["stragglers"] == 1 and r["step_time_max_s"] >= 1.0, r
    assert r["step_time_max_s"] > 1.3 * r["step_time_median_s"], r
