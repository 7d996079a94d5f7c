"""Training curves as PNG from logs/metrics.jsonl: loss (train and eval), eval perplexity, learning rate,
throughput and MFU (or, without a stated peak, utilisation of a matmul probe). Written to <run>/logs/plots/ at the end of training and on demand:

    python -m pretrain plot RUN_FOLDER
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.layout import RunPaths

# figure name -> (y-axis label, [(split, key, label)]), drawn on one axis; a figure with no data is skipped.
# MFU only against a stated peak (logging.peak_flops); a run without one logs `probe_util` (pretrain/metrics.py).
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
    written = []
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
