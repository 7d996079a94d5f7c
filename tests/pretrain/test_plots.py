"""Training curves as PNG: `python -m pretrain plot RUN` and the end of training write them from metrics.jsonl."""

from __future__ import annotations

import math

import pytest

from pretrain.__main__ import main
from pretrain.run.metrics import MetricsLogger
from pretrain.run.plots import read_metrics


def _run(tmp_path):
    logger = MetricsLogger(tmp_path / "run" / "logs", True, tensorboard=False)
    for step in range(10, 110, 10):
        logger.log(
            step,
            {
                "loss": 8 - math.log(step),
                "lr": 1e-3 * min(1, step / 30),
                "tokens_per_s": 5000 + step,
                "mfu": 0.01 * step / 100,
            },
        )
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


def test_mfu_only_against_a_stated_peak(tmp_path):
    """Issue 43 friction 5: a CPU run showed "MFU" of 36-55% against a matmul probe of its own host on the
    console, in TensorBoard and in mfu.png, while the card said MFU is not reported. Without a stated peak
    (logging.peak_flops) the figure is logged as what it is: utilisation of the probe, not MFU."""
    from pretrain.run.metrics import Throughput

    probe = Throughput(flops_per_token=6e6, peak_flops_per_rank=1e11, world_size=1, stated_peak=False)
    probe.add(tokens=1000, samples=10, wait_s=0.0)
    row = probe.report()
    assert "mfu" not in row and row["probe_util"] > 0
    stated = Throughput(flops_per_token=6e6, peak_flops_per_rank=1e11, world_size=1, stated_peak=True)
    stated.add(tokens=1000, samples=10, wait_s=0.0)
    row = stated.report()
    assert "probe_util" not in row and row["mfu"] > 0

    logger = MetricsLogger(tmp_path / "run" / "logs", True, tensorboard=False)
    for step in (10, 20):
        logger.log(step, {"loss": 3.0, "tokens_per_s": 100.0, "probe_util": 0.4})
    logger.close()
    assert main(["plot", str(tmp_path / "run")]) == 0
    plots = tmp_path / "run" / "logs" / "plots"
    assert (plots / "probe_util.png").is_file() and not (plots / "mfu.png").exists()


def test_every_plot_has_a_y_axis_label():
    from pretrain.run.plots import FIGURES

    for name, (ylabel, series) in FIGURES.items():
        assert ylabel and series, name
    assert "not MFU" in FIGURES["probe_util"][0] and "peak_flops" in FIGURES["mfu"][0]


def test_probe_panel_beside_the_loss_and_loss_per_source(tmp_path, capsys):
    """Issue 44 item 1: `pretrain plot` draws the probe's accuracy against tokens beside the loss (probe.png) and
    the held-out loss of each data source (loss_by_source.png)."""
    from pretrain.run.plots import probe_figure

    logger = MetricsLogger(tmp_path / "run" / "logs", True, tensorboard=False)
    logger.log(
        0,
        {
            "probe/accuracy": 0.4,
            "probe/random_init_accuracy": 0.4,
            "probe/majority_accuracy": 0.25,
            "probe/task": "bbc",
        },
        "eval",
    )
    for step in (10, 20, 30, 40):
        logger.log(step, {"loss": 6 - step / 20, "tokens_seen": 1000 * step})
    for step, acc in ((20, 0.6), (40, 0.8)):
        logger.log(
            step,
            {
                "loss": 6.5 - step / 20,
                "loss/crawl": 7 - step / 20,
                "loss/bbc": 6 - step / 20,
                "probe/accuracy": acc,
                "probe/random_init_accuracy": 0.4,
                "probe/majority_accuracy": 0.25,
            },
            "eval",
        )
    logger.close()
    run = tmp_path / "run"
    assert main(["plot", str(run)]) == 0
    names = {p.rsplit("/", 1)[1] for p in capsys.readouterr().out.split()}
    assert {"probe.png", "loss_by_source.png", "loss.png"} <= names
    for name in ("probe.png", "loss_by_source.png"):
        assert (run / "logs" / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    fig = probe_figure(read_metrics(run / "logs" / "metrics.jsonl"), "run")
    loss_ax, probe_ax = fig.axes
    assert loss_ax.get_xlabel() == probe_ax.get_xlabel() == "tokens seen"
    assert probe_ax.get_ylabel() == "dev accuracy" and "bbc" in probe_ax.get_title()
    curve = probe_ax.get_lines()[0]
    assert list(curve.get_xdata()) == [0, 20000, 40000] and list(curve.get_ydata()) == [0.4, 0.6, 0.8]
    refs = {line.get_label(): line.get_ydata()[0] for line in probe_ax.get_lines()[1:]}
    assert refs == {"probe, random init": 0.4, "majority class": 0.25}
    assert (
        probe_figure(
            [r for r in read_metrics(run / "logs" / "metrics.jsonl") if "probe/accuracy" not in r], "x"
        )
        is None
    )
