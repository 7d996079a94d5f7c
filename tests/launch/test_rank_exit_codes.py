"""What `launch run` (and each Slurm node) exits with when ranks fail: the ranks' own lmstack code, not
torchrun's 1, and one line instead of torchrun's ChildFailedError traceback (which names whichever rank failed
first, so after a hang it named the reporting rank 0, not the hung rank the watchdog had named)."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from core.net import free_port
from launch import render
from launch.render import Entry
from runconfig import load_config
from tests.launch.conftest import ROOT, child_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Rank 0 exits with the code it is given after a moment (as the watchdog's reporter does after a hang); rank 1
# never finishes on its own (the hung rank), so torchrun stops it with a signal.
RANKS = textwrap.dedent(
    """
    import os, sys, time
    if os.environ["RANK"] == "0":
        time.sleep(1.0)
        sys.exit(int(sys.argv[1]))
    time.sleep(600)
    """
)


def _run(tmp_path, code: int) -> subprocess.CompletedProcess:
    (tmp_path / "fake_ranks.py").write_text(RANKS)
    cfg = load_config(
        ROOT / "configs" / "roberta-tiny.yaml",
        [f"run.output_dir={tmp_path}/run", "launch.procs_per_node=2", f"launch.master_port={free_port()}"],
    )
    (cmd,) = render.node_commands(cfg, Entry("fake_ranks", [str(code)]))
    env = {**child_env(), **cmd.env, "PYTHONPATH": f"{ROOT}:{tmp_path}"}
    return subprocess.run(cmd.argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)


@pytest.mark.parametrize("code", [69, 79, 65])
def test_a_rank_s_lmstack_code_is_the_node_s_exit_code(tmp_path, code):
    res = _run(tmp_path, code)
    assert res.returncode == code, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "ChildFailedError" not in res.stderr, res.stderr[-3000:]
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("[launch]")]
    assert len(said) == 1 and f"rank 0 exited {code}" in said[0] and "rank 1" in said[0], res.stderr[-3000:]


def test_a_plain_failure_stays_1(tmp_path):
    res = _run(tmp_path, 1)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
