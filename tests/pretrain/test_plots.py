"""Training curves as PNG: `python -m pretrain plot RUN` and the end of training write them from metrics.jsonl."""

from __future__ import annotations

import math

import pytest

from pretrain.__main__ import main
from pretrain.metrics import MetricsLogger
from pretrain.plots import read_metrics


def _run(tmp_path):
    logger = MetricsLogger(tmp_path / "run" / "logs", True, tensorboard=False)
    for step in range(10, 110, 10):
        logger.log(step, {"loss": 8 - math.log(step), "lr": 1e-3 * min(1, step / 30), "tokens_per_s": 5000 + step,
                          "mfu": 0.01 * step / 100})  # fmt: skip
        if step % 50 == 0:
            logger.log(
                step, {"loss": 8.5 - math.log(step), "perplexity": math.exp(8.5 - math.log(step))}, "eval"
            )
    # a resumed run redid step 100
    logger.log(100, {"loss": 3.0, "lr": 1e-4, "tokens_per_s": 1.0, "mfu": 0.0})
    logger.close()
    return tmp_path / "run"


def test_plot_command_writes_every_curve(tmp_path, capsys):
    run = _run(tmp_path)
    assert main(["plot", str(run)]) == 0
    printed = capsys.readouterr().out.split()
    names = sorted(p.rsplit("/", 1)[1] for p in printed)
    assert names == ["loss.png", "lr.png", "mfu.png", "perplexity.png", "throughput.png"]
    for name in names:
        data = (run / "logs" / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    rows = read_metrics(run / "logs" / "metrics.jsonl")
    assert [r["loss"] for r in rows if r["split"] == "train" and r["step"] == 100] == [3.0]  # last row wins


def test_plot_without_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics to plot"):
        main(["plot", str(tmp_path)])
