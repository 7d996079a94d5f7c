"""The per-layer probing report of the frozen method: a table (probe test accuracy by layer, pretrained against
random init) and a PNG of the same curves, one panel per task, written beside transfer.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.io import atomic_write

LAYERS_TABLE = "probe_layers.md"
LAYERS_PLOT = "probe_layers.png"


def _layer_rows(task: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    arms = task.get("methods", {}).get("frozen", {}).get("arms", {})
    return {arm: e["layers"] for arm, e in arms.items() if e.get("layers")}


def layer_table(report: dict[str, Any]) -> str:
    """Markdown: a row per layer (0 = embeddings), a column per arm (test accuracy of that layer's probe)."""
    out = []
    for name, task in report["tasks"].items():
        rows = _layer_rows(task)
        if not rows:
            continue
        arms = list(rows)
        out += [f"### {name}", "", "| layer | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
        for i in range(max(len(r) for r in rows.values())):
            cells = [rows[a][i]["test"] if i < len(rows[a]) else None for a in arms]
            out.append(f"| {i} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def layer_plot(report: dict[str, Any], path: Path) -> Path | None:
    """Probe test accuracy against layer, an arm per line, a panel per task (matplotlib, no display)."""
    tasks = {n: _layer_rows(t) for n, t in report["tasks"].items()}
    tasks = {n: r for n, r in tasks.items() if r}
    if not tasks:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.5), squeeze=False)
    for ax, (name, rows) in zip(axes[0], tasks.items(), strict=True):
        for arm, layers in rows.items():
            ax.plot([r["layer"] for r in layers], [r["test"] for r in layers], marker="o", label=arm)
        ax.set(title=name, xlabel="layer (0 = embeddings)", ylabel="probe test accuracy")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return path


def write_layer_report(report: dict[str, Any], folder: Path) -> list[Path]:
    """The table and the PNG into `folder` (nothing where no task ran the frozen method)."""
    table = layer_table(report)
    if not table:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / LAYERS_TABLE, table.encode())
    png = layer_plot(report, folder / LAYERS_PLOT)
    return [folder / LAYERS_TABLE, *([png] if png else [])]


def method_lines(task: dict[str, Any], accuracy_text) -> list[str]:
    """The transfer report's lines for the methods beyond `full`: each arm's test accuracy and the margin."""
    lines = []
    for method, m in task.get("methods", {}).items():
        for arm, e in m["arms"].items():
            extra = ""
            if method == "frozen":
                extra = (
                    f"  layer {e['best_layer']} (dev-best) {e['best_layer_test_accuracy']:.3f}, "
                    f"last layer {e['last_layer_test_accuracy']:.3f}"
                )
            lines.append(f"  {method + '/' + arm:<20} {accuracy_text(e)}  (lr {e['lr']:g}){extra}")
        if "margin" in m:
            p = m.get("p_value")
            lines.append(
                f"  {method} margin {100 * m['margin']:+.1f} points"
                + (f" (Welch p={p:.3g})" if p is not None else "")
            )
    return lines
