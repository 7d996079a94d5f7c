"""Training curves as PNG from logs/metrics.jsonl: loss (train and eval), eval perplexity, learning rate,
throughput and MFU (or, without a stated peak, utilisation of a matmul probe); the held-out loss of each data source
(loss_by_source.png); with `eval.probe_task`, the probe's accuracy against tokens beside the loss (probe.png); with
`eval.tasks`, one panel per harness task, its headline metric against tokens with its random-init figure (tasks.png).
Written to <run>/logs/plots/ at the end of training and on demand:

    python -m pretrain plot RUN_FOLDER
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.layout import RunPaths

# figure name -> (y-axis label, [(split, key, label)]), drawn on one axis; a figure with no data is skipped.
# MFU only against a stated peak (logging.peak_flops); a run without one logs `probe_util` (pretrain/run/metrics.py).
FIGURES: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "loss": ("loss (nats per token)", [("train", "loss", "train loss"), ("eval", "loss", "held-out loss")]),
    "perplexity": ("perplexity (log scale)", [("eval", "perplexity", "held-out perplexity")]),
    "lr": ("learning rate", [("train", "lr", "learning rate")]),
    "throughput": ("tokens/s (all ranks)", [("train", "tokens_per_s", "tokens/s")]),
    "mfu": ("MFU (of logging.peak_flops)", [("train", "mfu", "MFU")]),
    "probe_util": (
        "model FLOP/s / matmul probe (not MFU)",
        [("train", "probe_util", "utilisation of this host's matmul probe")],
    ),
}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash mid-write
    # A resumed run appends the steps it redoes: the last row per (split, step) wins.
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if "step" in r:
            last[(r.get("split", "train"), int(r["step"]))] = r
    return [last[k] for k in sorted(last, key=lambda k: (k[1], k[0]))]


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write one PNG per figure with data; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics = RunPaths(run_dir).metrics
    if not metrics.is_file():
        raise FileNotFoundError(f"no metrics to plot: {metrics} does not exist (has the run trained?)")
    rows = read_metrics(metrics)
    out = Path(out_dir) if out_dir else RunPaths(run_dir).plots
    out.mkdir(parents=True, exist_ok=True)
    drawn_apart = (_plot_sources, _plot_probe, _plot_tasks)
    written = [p for p in (draw(rows, out, run_dir.name) for draw in drawn_apart) if p]
    for name, (ylabel, series) in FIGURES.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = False
        for split, key, label in series:
            pts = [
                (r["step"], r[key])
                for r in rows
                if r.get("split") == split and isinstance(r.get(key), int | float)
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(pts) < 20 else None, label=label)
                drawn = True
        if drawn:
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{run_dir.name}: {name}")
            if name == "perplexity":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend()
            fig.tight_layout()
            path = out / f"{name}.png"
            fig.savefig(path, dpi=100)
            written.append(path)
        plt.close(fig)
    return written


def _series(rows: list[dict[str, Any]], split: str, key: str) -> list[tuple[int, float]]:
    return [
        (r["step"], r[key]) for r in rows if r.get("split") == split and isinstance(r.get(key), int | float)
    ]


def _plot_sources(rows: list[dict[str, Any]], out: Path, title: str) -> Path | None:
    """Held-out loss per data source (eval rows' loss/<source>) and the mixed figure, against steps."""
    import matplotlib.pyplot as plt

    keys = sorted({k for r in rows if r.get("split") == "eval" for k in r if k.startswith("loss/")})
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in [("loss", "mixed"), *((k, k.split("/", 1)[1]) for k in keys)]:
        pts = _series(rows, "eval", key)
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(
                xs, ys, marker="o" if len(pts) < 20 else None, label=label, lw=2.5 if key == "loss" else 1.5
            )
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss (nats per token)")
    ax.set_title(f"{title}: held-out loss per data source")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "loss_by_source.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _tokens_at(rows: list[dict[str, Any]]):
    """Step -> tokens seen, interpolated between the train rows (eval rows carry no token count; step 0 is 0)."""
    import numpy as np

    pts = sorted({0: 0.0, **{s: float(v) for s, v in _series(rows, "train", "tokens_seen")}}.items())
    xs, ys = (np.asarray(v, dtype=float) for v in zip(*pts, strict=True))
    return lambda step: float(np.interp(step, xs, ys))


def _plot_probe(rows: list[dict[str, Any]], out: Path, title: str) -> Path | None:
    import matplotlib.pyplot as plt

    fig = probe_figure(rows, title)
    if fig is None:
        return None
    path = out / "probe.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def probe_figure(rows: list[dict[str, Any]], title: str):
    """Two panels against tokens seen: the loss (train, held-out) and the probe's dev accuracy beside it, with the
    random-init probe and the majority class as reference lines. None without probe rows."""
    import matplotlib.pyplot as plt

    acc = [(s, v) for s, v in _series(rows, "eval", "probe/accuracy") if v == v]  # nan: the time bound hit
    if not acc:
        return None
    tokens = _tokens_at(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), sharex=True)
    for split, label in (("train", "train loss"), ("eval", "held-out loss")):
        pts = _series(rows, split, "loss")
        if pts:
            marker = "o" if len(pts) < 20 else None
            left.plot([tokens(s) for s, _ in pts], [v for _, v in pts], marker=marker, label=label)
    left.set_xlabel("tokens seen")
    left.set_ylabel("loss (nats per token)")
    left.set_title(f"{title}: loss")
    task = next((r.get("probe/task") for r in rows if r.get("probe/task")), None)
    right.plot(
        [tokens(s) for s, _ in acc], [v for _, v in acc], marker="o", label="probe, current weights (dev)"
    )
    for key, label, style in (
        ("probe/random_init_accuracy", "probe, random init", "--"),
        ("probe/majority_accuracy", "majority class", ":"),
    ):
        ref = [v for _, v in _series(rows, "eval", key) if v == v]
        if ref:
            right.axhline(ref[-1], ls=style, color="grey" if style == ":" else "tab:red", label=label)
    right.set_xlabel("tokens seen")
    right.set_ylabel("dev accuracy")
    right.set_ylim(0, 1)
    right.set_title(f"{title}: linear probe" + (f" ({task})" if task else ""))
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


# a harness task's headline metric, by the kind data_pipeline/eval_tasks.py names it with (its last word)
TASK_HEADLINE = {"choice": "acc", "cloze": "acc", "ppl": "word_perplexity"}


def _plot_tasks(rows: list[dict[str, Any]], out: Path, title: str) -> Path | None:
    """eval.tasks: one panel per task, its headline metric (else its first) against tokens seen, the random-init
    figure as a dashed line. None without task rows."""
    import matplotlib.pyplot as plt

    keys = sorted({k for r in rows if r.get("split") == "eval" for k in r if k.startswith("tasks/")})
    per_task: dict[str, list[str]] = {}
    for k in keys:
        parts = k.split("/")
        if len(parts) == 3 and not parts[2].endswith("_random_init"):
            per_task.setdefault(parts[1], []).append(parts[2])
    if not per_task:
        return None
    tokens = _tokens_at(rows)
    fig, axes = plt.subplots(1, len(per_task), figsize=(5 * len(per_task), 4), squeeze=False)
    for ax, (task, metrics) in zip(axes[0], sorted(per_task.items()), strict=True):
        want = TASK_HEADLINE.get(task.rsplit("_", 1)[-1])
        metric = want if want in metrics else metrics[0]
        pts = _series(rows, "eval", f"tasks/{task}/{metric}")
        ax.plot([tokens(s) for s, _ in pts], [v for _, v in pts], marker="o", label="current weights")
        ref = _series(rows, "eval", f"tasks/{task}/{metric}_random_init")
        if ref:
            ax.axhline(ref[-1][1], ls="--", color="tab:red", label="random init")
        if "perplexity" in metric:
            ax.set_yscale("log")
        ax.set_xlabel("tokens seen")
        ax.set_ylabel(metric)
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{title}: lm-evaluation-harness tasks")
    fig.tight_layout()
    path = out / "tasks.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
