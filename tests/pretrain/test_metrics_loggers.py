"""metrics.jsonl carries wall-clock time; the optional W&B (offline) and MLflow (local file store) loggers receive
the same rows when switched on, and nothing of theirs runs when they are off (the default)."""

from __future__ import annotations

import json
import time

import pytest

from pretrain.metrics import MetricsLogger
from runconfig import load_config


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
    assert rows[0]["timestamp"].endswith("Z") and rows[0]["timestamp"][:4] == time.strftime("%Y", time.gmtime())


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    cfg = _cfg(tmp_path, "logging.wandb.enabled=true", "logging.wandb.mode=offline", "logging.tensorboard=false",
               f"logging.wandb.dir={tmp_path}/wb")  # fmt: skip
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


def test_mlflow_local_file_store(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    cfg = _cfg(tmp_path, "logging.mlflow.enabled=true", "logging.tensorboard=false", "logging.jsonl=false")
    logger = MetricsLogger.from_config(cfg, tmp_path / "logs", True)
    _log_some(logger)
    uri = (tmp_path / "logs" / "mlruns").resolve().as_uri()  # the default: a local store in the run folder
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("lmstack")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == cfg.run.name and run.data.params["model.family"] == "roberta"
    hist = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in hist] == [(10, 4.0), (20, 3.0)]
    assert client.get_metric_history(run.info.run_id, "eval/perplexity")[0].value == 90.0
