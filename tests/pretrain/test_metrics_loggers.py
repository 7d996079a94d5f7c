"""metrics.jsonl carries wall-clock time; the optional W&B (offline) and MLflow (local file store) loggers receive
the same rows when switched on, and nothing of theirs runs when they are off (the default)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from launch.side_venv import ensure_venv
from pretrain.run.metrics import MetricsLogger
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
MLFLOW_VENV = ROOT / ".venv-mlflow"


def _cfg(tmp_path, *overrides):
    return load_config("configs/roberta-tiny.yaml", [f"run.output_dir={tmp_path}/run", *overrides])


def _log_some(logger):
    for step in (10, 20):
        logger.log(step, {"loss": 5.0 - step / 10, "lr": 1e-3, "note": "text is skipped by scalar sinks"})
    logger.log(20, {"loss": 4.5, "perplexity": 90.0}, prefix="eval")
    logger.close()


def test_jsonl_rows_have_wall_clock_time_and_optional_loggers_are_off(tmp_path):
    cfg = _cfg(tmp_path)
    assert not cfg.logging.wandb.enabled and not cfg.logging.mlflow.enabled
    t0 = time.time()
    logger = MetricsLogger.from_config(cfg, tmp_path / "logs", True)
    assert [type(s).__name__ for s in logger.sinks] == ["TensorBoardSink", "JsonlSink"]
    _log_some(logger)
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(t0 - 1 <= r["time"] <= time.time() + 1 for r in rows)
    assert rows[0]["timestamp"].endswith("Z") and rows[0]["timestamp"][:4] == time.strftime(
        "%Y", time.gmtime()
    )


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    cfg = _cfg(
        tmp_path,
        "logging.wandb.enabled=true",
        "logging.wandb.mode=offline",
        "logging.tensorboard=false",
        f"logging.wandb.dir={tmp_path}/wb",
    )
    logger = MetricsLogger.from_config(cfg, tmp_path / "logs", True)
    _log_some(logger)
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wb").rglob("*"))[:20]
    (log,) = runs[0].glob("run-*.wandb")  # what `wandb sync` uploads later
    deadline = time.time() + 20
    while len(hist := _wandb_history(log)) < 2 and time.time() < deadline:
        time.sleep(0.5)  # wandb-core may still be flushing its log file after finish() returns
    assert [(int(h["_step"]), float(h["train/loss"])) for h in hist] == [(10, 4.0), (20, 3.0)]
    assert float(hist[-1]["eval/perplexity"]) == 90.0 and not any("train/note" in h for h in hist)


def _wandb_history(path):
    """History rows of an offline run file: W&B's LevelDB-style log (7-byte header, 32 KiB blocks of
    crc32/length/type-framed chunks) of `Record` protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, records, buf = path.read_bytes(), 7, 32768, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind == 1:
            records.append(chunk)
        elif kind in (2, 3):
            buf = chunk if kind == 2 else buf + chunk
        elif kind == 4:
            records.append(buf + chunk)
    rows = []
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item})
    return rows


MLFLOW_CHECK = """
import json, sys
from pathlib import Path
import mlflow
from pretrain.run.metrics import MetricsLogger
from runconfig import load_config
from tests.pretrain.test_metrics_loggers import _log_some
tmp = Path(sys.argv[1])
cfg = load_config("configs/roberta-tiny.yaml", [f"run.output_dir={tmp}/run", "logging.mlflow.enabled=true",
                  "logging.tensorboard=false", "logging.jsonl=false"])
_log_some(MetricsLogger.from_config(cfg, tmp / "logs", True))
uri = (tmp / "logs" / "mlruns").resolve().as_uri()  # the default: a local store in the run folder
client = mlflow.tracking.MlflowClient(tracking_uri=uri)
(run,) = client.search_runs([client.get_experiment_by_name("lmstack").experiment_id])
arts = [a.path for a in client.list_artifacts(run.info.run_id)]
print(json.dumps({"name": run.info.run_name, "want_name": cfg.run.name, "family": run.data.params["model.family"],
                  "slurm_time": run.data.params.get("launch.slurm.time"), "n_params": len(run.data.params),
                  "artifacts": arts,
                  "loss": [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")],
                  "ppl": [m.value for m in client.get_metric_history(run.info.run_id, "eval/perplexity")]}))
"""


@pytest.mark.slow  # builds a side venv with mlflow-skinny from PyPI (cached afterwards)
@pytest.mark.timeout(900)
def test_mlflow_local_file_store(tmp_path):
    """MLflow lives in a side venv layered on the test venv (built once, cached): installed in the test venv
    itself, `import deepspeed` imports it in every training rank of the suite (deepspeed.autotuning does, ~1.2 s
    CPU each), which is what a default install (mlflow is the optional `lmstack[mlflow]`) never pays."""
    python = ensure_venv(MLFLOW_VENV, ["mlflow-skinny>=2.10"], probe="import mlflow, torch", layered=True)
    res = subprocess.run(
        [str(python), "-c", MLFLOW_CHECK, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["name"] == got["want_name"] and got["family"] == "roberta"
    assert got["loss"] == [[10, 4.0], [20, 3.0]] and got["ppl"] == [90.0]
    # the whole resolved config: every key as a param (not the first 100) and the YAML as an artifact
    assert (
        got["slurm_time"] == "01:00:00"
        and got["n_params"] > 100
        and "resolved_config.yaml" in got["artifacts"]
    )


def test_mlflow_missing_names_the_extra(tmp_path):
    """In the test venv (as in a default install) mlflow is absent: switching it on says what to install."""
    if importlib.util.find_spec("mlflow") is not None:
        pytest.skip("mlflow is installed here")
    cfg = _cfg(tmp_path, "logging.mlflow.enabled=true")
    with pytest.raises(RuntimeError, match=r"pip install 'lmstack\[mlflow\]'"):
        MetricsLogger.from_config(cfg, tmp_path / "logs", True)


def test_mlflow_params_cover_the_whole_config_in_batches(tmp_path):
    """Every resolved key (finetune.*, export.*, launch.slurm.* included), flattened, in log_params batches of
    at most 100 (MLflow's per-call limit)."""
    from pretrain.run.metrics import flat_params, param_batches

    cfg = _cfg(tmp_path, "launch.slurm.time=02:00:00")
    flat = flat_params(cfg)
    assert flat["launch.slurm.time"] == "02:00:00" and flat["model.family"] == "roberta"
    for section in ("finetune.", "export.", "launch.", "data.clean.", "deepspeed."):
        assert any(k.startswith(section) for k in flat), section
    assert len(flat) > 100  # more than one batch: the old cut at 100 lost the later sections
    batches = param_batches(flat)
    assert all(len(b) <= 100 for b in batches) and sum(len(b) for b in batches) == len(flat)
    assert all(len(v) <= 6000 for v in flat.values())  # MLflow's value limit


def test_wandb_reinit_is_the_current_string_setting(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from runconfig import ConfigError

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    base = [
        "logging.wandb.enabled=true",
        "logging.wandb.mode=offline",
        "logging.tensorboard=false",
        f"logging.wandb.dir={tmp_path}/wb",
    ]
    cfg = _cfg(tmp_path, *base)
    assert cfg.logging.wandb.reinit == "finish_previous"
    logger = MetricsLogger.from_config(cfg, tmp_path / "logs", True)
    (sink,) = [s for s in logger.sinks if type(s).__name__ == "WandbSink"]
    assert sink.run.settings.reinit == "finish_previous"  # a string, not the deprecated boolean
    logger.close()
    with pytest.raises(ConfigError, match="logging.wandb.reinit"):
        _cfg(tmp_path, *base, "logging.wandb.reinit=true")
