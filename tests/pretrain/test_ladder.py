"""`python -m pretrain ladder`: rungs of one family trained on the same shards, the loss fitted against the
non-embedding parameters, a bigger rung predicted; a killed ladder reruns only the rungs it did not finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from core.errors import ConfigError
from pretrain.tools.ladder import fit_power_law, parse_rungs, predict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(60)
def test_the_fit_recovers_a_known_law():
    ns = [1e4, 3e4, 1e5, 3e5, 1e6]
    losses = [2.0 + 3.0 * (n / 1e4) ** -0.4 for n in ns]
    fit = fit_power_law([int(n) for n in ns], losses)
    assert fit["E"] == pytest.approx(2.0, rel=1e-3) and fit["alpha"] == pytest.approx(0.4, rel=1e-3)
    assert fit["rms_relative_residual"] < 1e-6 and fit["leave_one_out_relative_error"] < 1e-4
    assert predict(fit, 3_000_000) == pytest.approx(2.0 + 3.0 * 300**-0.4, rel=1e-4)


@pytest.mark.timeout(60)
def test_bad_rungs_are_refused_naming_the_flag():
    assert parse_rungs("64,128x3, 192") == [(64, None), (128, 3), (192, None)]
    with pytest.raises(ConfigError, match="--rungs: 'wide' is not WIDTH"):
        parse_rungs("64,wide")
    with pytest.raises(ConfigError, match="3 rungs or more"):
        fit_power_law([10, 20], [3.0, 2.5])


def _ladder(config, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pretrain",
        "ladder",
        "--config",
        str(config),
        "--rungs",
        "32,64,96",
        "--tokens-per-param",
        "0.2",
        "--predict",
        "128",
        "launch.procs_per_node=1",
        *extra,
    ]


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_a_killed_ladder_reruns_only_unfinished_rungs(tmp_path):
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

    config, out = prepare_smoke_run(tmp_path)
    env = {**os.environ, "PYTHONPATH": ROOT, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    first = out / "ladder" / "w32-l2" / "rung.json"
    with open(tmp_path / "first.log", "wb") as log:
        proc = subprocess.Popen(
            _ladder(config), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 400
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert first.exists(), (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(3)  # into the second rung
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    kept = first.stat().st_mtime_ns
    res = subprocess.run(_ladder(config), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert first.stat().st_mtime_ns == kept  # the finished rung was not trained again
    assert "w32-l2: done before" in res.stdout
    report = json.loads((out / "ladder" / "ladder.json").read_text())
    assert [r["name"] for r in report["rungs"]] == ["w32-l2", "w64-l2", "w96-l2"]
    params = [r["params"] for r in report["rungs"]]
    assert params == sorted(params) and all(r["loss"] > 0 for r in report["rungs"])
    (pred,) = report["predictions"]
    assert pred["name"] == "w128-l2" and pred["params"] > params[-1] and pred["predicted_loss"] > 0
    assert (out / "ladder" / "ladder.png").stat().st_size > 0 and "predicted" in res.stdout
    # each rung read the run's shards: no data stage ran in a rung's folder
    assert not (out / "ladder" / "w64-l2" / "clean").exists()


@pytest.mark.timeout(120)
def test_a_rung_that_would_not_fit_is_refused_before_any_trains(tmp_path):
    from pretrain.tools.ladder import run_ladder

    config = os.path.join(ROOT, "configs", "gpt2-tiny.yaml")
    with pytest.raises(ConfigError, match=r"rung w256-l2 needs about .* GiB per rank"):
        run_ladder(config, [f"run.output_dir={tmp_path}/run"], "64,128,256", memory_gib=0.09)
    assert not (tmp_path / "run" / "ladder").exists()
