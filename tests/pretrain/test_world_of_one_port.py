"""A plain `python -m pretrain train` (a world of one, no torchrun) must not need a fixed port: two single-process
runs on one machine (two users, or two test workers) both took `launch.master_port` (29500) for their store, and the
second died with EADDRINUSE (seen in CI). A world of one takes a free port unless MASTER_PORT or
`launch.master_port` is set explicitly."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.pretrain.conftest import ROOT, child_env

# one worker runs this module: its two cases each hold port 29500 while they run (CI: the second bind failed)
pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(300), pytest.mark.xdist_group("port-29500")]

SCRIPT = r"""
import sys
from runconfig import load_config
from pretrain.run.engine import init_distributed
from runconfig.load import save_resolved
cfg = load_config("configs/demo.yaml", [f"run.output_dir={sys.argv[1]}", *sys.argv[3:]])
if sys.argv[2] == "resolved":  # the run started again from the config another run recorded
    cfg = load_config(str(save_resolved(cfg, sys.argv[1])))
print(init_distributed(cfg))
"""


def _start(tmp_path, *overrides: str, source: str = "yaml") -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in child_env().items() if k not in ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), source, *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize("source", ["yaml", "resolved"])
def test_a_world_of_one_starts_while_the_default_port_is_taken(tmp_path, source):
    # "resolved": a config another run recorded (the continued arm trains from one) names every field, and once
    # pinned 29500 again (a CI failure of test_continued_arm_runs_and_is_reported_beside_the_export)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 29500))  # another single-process run's store
        busy.listen()
        res = _start(tmp_path, source=source)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "(0, 1)"


def test_an_explicit_master_port_is_kept(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = _start(tmp_path, f"launch.master_port={port}")
    assert res.returncode != 0 and "EADDRINUSE" in res.stderr, res.stderr[-3000:]
