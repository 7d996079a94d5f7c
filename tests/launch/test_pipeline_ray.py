"""`python -m launch pipeline-ray`: the whole data path as Ray tasks gives the same corpus and token shards as
the local `python -m data_pipeline all`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.launch.conftest import ROOT, child_env, write_tiny_config

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(600)]


def test_pipeline_ray_matches_local(prepared_run, tmp_path):
    pytest.importorskip("ray")
    cfg = write_tiny_config(tmp_path, "rayp", tmp_path / "run")
    env = {**child_env(), "RAY_USAGE_STATS_ENABLED": "0"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "pipeline-ray",
            "--config",
            str(cfg),
            "--address",
            "local",
            "data.ray.num_cpus_per_task=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout[res.stdout.index("{") :])
    assert out["executor"] == "ray"
    mine = json.loads((tmp_path / "run" / "tokens" / "manifest.json").read_text())
    ref = json.loads((prepared_run / "tokens" / "manifest.json").read_text())
    assert mine["complete"] and mine["totals"] == ref["totals"]
    d_mine = json.loads((tmp_path / "run" / "dedup" / "dedup_stats.json").read_text())
    d_ref = json.loads((prepared_run / "dedup" / "dedup_stats.json").read_text())
    assert d_mine["per_source"] == d_ref["per_source"]
    assert "[dedup-signatures]" in res.stderr or "dedup-signatures" in res.stderr  # per-stage progress


@pytest.mark.timeout(180)
@pytest.mark.parametrize("form", ["{}", "ray://{}"])
def test_an_address_with_nothing_listening_is_refused_in_one_line(tmp_path, form):
    """Was: more than 2 minutes of Ray's reconnect warnings. Now one line naming the key and the address, before
    any stage begins (nothing is written in the run folder)."""
    pytest.importorskip("ray")
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = form.format(f"127.0.0.1:{port}")
    cfg = write_tiny_config(tmp_path, "rayq", tmp_path / "run")
    env = {**child_env(), "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "launch", "pipeline-ray", "--config", str(cfg), "--address", address]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "data.ray.address" in lines[0] and f"127.0.0.1:{port}" in lines[0], lines
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file()]  # no stage began
