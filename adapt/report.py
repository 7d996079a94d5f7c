"""The transfer report: transfer.json (atomic), TensorBoard scalars, the printed summary; and the per-layer
probing report of a method that probes every layer (the frozen body's), a table (probe test accuracy by layer,
pretrained against random init) and a PNG of the same curves, one panel per task, written beside transfer.json.
Each adaptation method is named by its spec's own description (MethodSpec.description)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from adapt.probes import DEGENERATE_TOKEN_COSINE
from adapt.scoring import ACCURACY, COLLAPSE_PREDICTED_SHARE, SPEARMAN
from core.errors import DiskFullError, is_disk_full
from core.io import atomic_write, json_bytes
from core.registry import ADAPT_METHODS
from pretrain.export.model_card import METRIC_TEXT, method_text

LAYERS_TABLE = "probe_layers.md"
LAYERS_PLOT = "probe_layers.png"


def _layer_rows(task: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each arm's per-layer probes, from the method whose entries carry them (`layers`: the frozen body's)."""
    for m in task.get("methods", {}).values():
        rows = {arm: e["layers"] for arm, e in m.get("arms", {}).items() if e.get("layers")}
        if rows:
            return rows
    return {}


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


def metric_text(task: dict[str, Any]) -> str:
    """What a task's figures are, in words: 'accuracy', or 'Pearson r' for a regression task."""
    metric = task.get("metric", ACCURACY)
    return METRIC_TEXT.get(metric, metric)


def layer_figure(report: dict[str, Any]) -> Any | None:
    """Probe test metric (accuracy, or Pearson r for regression) against layer, an arm per line, a panel per task
    (matplotlib, no display); None where no task ran the frozen method."""
    tasks = {n: (_layer_rows(t), metric_text(t)) for n, t in report["tasks"].items()}
    tasks = {n: (r, m) for n, (r, m) in tasks.items() if r}
    if not tasks:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.5), squeeze=False)
    for ax, (name, (rows, metric)) in zip(axes[0], tasks.items(), strict=True):
        for arm, layers in rows.items():
            ax.plot([r["layer"] for r in layers], [r["test"] for r in layers], marker="o", label=arm)
        ax.set(title=name, xlabel="layer (0 = embeddings)", ylabel=f"probe test {metric}")
        ax.legend()
    fig.tight_layout()
    return fig


def layer_plot(report: dict[str, Any], path: Path) -> Path | None:
    """layer_figure as a PNG at `path` (nothing where no task ran the frozen method)."""
    fig = layer_figure(report)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

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


def method_lines(task: dict[str, Any]) -> list[str]:
    """The transfer report's lines for the methods beyond the primary one: the method as its spec describes it,
    each arm's test accuracy (and what the spec's `report_text` adds) and the margin."""
    lines = []
    for method, m in task.get("methods", {}).items():
        spec = ADAPT_METHODS.get(method) if method in ADAPT_METHODS else None
        lines.append(f"  {method}: {method_text(method)}")
        for arm, e in m["arms"].items():
            extra = spec.report_text(e) if spec is not None and spec.report_text is not None else ""
            lines.append(f"  {method + '/' + arm:<20} {accuracy_text(e)}  (lr {e['lr']:g}){extra}")
        if "margin" in m:
            p = m.get("p_value")
            lines.append(
                f"  {method} margin {margin_text(task, m['margin'])}"
                + (f" (Welch p={p:.3g})" if p is not None else "")
            )
    return lines


RESULT_FILE = "transfer.json"


def steps_text(entry: dict[str, Any]) -> str:
    """The optimizer steps each seed's run took ('60 steps', or '60/72/64 steps' where early stopping differed)."""
    steps = list(entry.get("steps_by_seed", {}).values()) or [entry.get("steps")]
    return f"{steps[0]} steps" if len(set(steps)) == 1 else f"{'/'.join(map(str, steps))} steps"


def accuracy_text(entry: dict[str, Any]) -> str:
    """'0.812 ± 0.010' (no spread from one seed: '0.812'), with the collapsed seeds named (kept out of the mean),
    or 'collapsed' for every seed."""
    t = entry["test_accuracy"]
    bad = entry.get("collapsed", {})
    if t["mean"] is None:
        return f"collapsed (every seed: {', '.join(bad)})"
    spread = f" ± {t['sd']:.3f}" if len(t.get("values", [])) >= 2 else ""
    txt = f"{t['mean']:.3f}{spread}"
    return txt + (f" (collapsed seeds {', '.join(bad)} left out)" if bad else "")


def margin_text(task: dict[str, Any], margin: float) -> str:
    """A margin in the task's metric's units: accuracy in points (x100), a correlation as a difference of r."""
    if task.get("metric", ACCURACY) == ACCURACY:
        return f"{100 * margin:+.1f} points"
    return f"{margin:+.3f} {metric_text(task)}"


def seeds_text(n: int) -> str:
    """'1 seed', '3 seeds'."""
    return f"{n} seed{'s' if n != 1 else ''}"


def write_report(report: dict[str, Any], folders: list[Path]) -> None:
    """`transfer.json` into each folder, atomically: on a full disk the previous report stays whole (a truncated
    one would drop results from the card and break `pretrain card`)."""
    data = json_bytes(report)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            atomic_write(folder / RESULT_FILE, data)
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise DiskFullError(
                f"writing {folder / RESULT_FILE} failed: the disk is full "
                f"({shutil.disk_usage(folder).free / 2**20:.1f} MiB free); the previous report there is left whole"
            ) from e


def _arm_scalars(w: Any, prefix: str, metric: str, e: dict[str, Any]) -> None:
    """One arm's TensorBoard scalars under `prefix`, named for the task's metric (test_accuracy, test_pearsonr and
    test_spearmanr for regression)."""
    if e["test_accuracy"]["mean"] is not None:
        w.add_scalar(f"{prefix}/test_{metric}", e["test_accuracy"]["mean"], 0)
    if (e.get("test_spearman") or {}).get("mean") is not None:
        w.add_scalar(f"{prefix}/test_{SPEARMAN}", e["test_spearman"]["mean"], 0)
    w.add_scalar(f"{prefix}/collapsed_runs", len(e.get("collapsed", {})), 0)
    if "probe_accuracy" in e:
        w.add_scalar(f"{prefix}/probe_{metric}", e["probe_accuracy"], 0)


def to_tensorboard(folder: Path, results: list[dict[str, Any]]) -> None:
    """Every task's figures: `transfer/<task>/<arm>/...` for the full fine-tune, `transfer/<task>/<method>/<arm>/...`
    for each other adaptation method, and the margins."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(folder))
    for r in results:
        metric = r.get("metric", ACCURACY)
        for arm, e in r["arms"].items():
            _arm_scalars(w, f"transfer/{r['task']}/{arm}", metric, e)
        if "margin" in r:
            w.add_scalar(f"transfer/{r['task']}/margin", r["margin"], 0)
        for method, m in r.get("methods", {}).items():
            for arm, e in m["arms"].items():
                _arm_scalars(w, f"transfer/{r['task']}/{method}/{arm}", metric, e)
            if "margin" in m:
                w.add_scalar(f"transfer/{r['task']}/{method}/margin", m["margin"], 0)
            w.add_text(f"transfer/{r['task']}/{method}", method_text(method), 0)
    w.close()


def best_lines(task: dict[str, Any]) -> list[str]:
    """The decision: the best method from the export against the best from random init (each picked on dev), and
    the methods whose random arm is at chance or below the best random arm."""
    bb = task.get("best_against_best")
    if not bb:
        return []
    pre, rnd, p = bb["pretrained"], bb["random"], bb.get("p_value")
    out = [
        f"  best vs best  {method_text(pre['method'])} from the export {pre['test']:.3f} vs "
        f"{method_text(rnd['method'])} from random init {rnd['test']:.3f}: {margin_text(task, bb['margin'])}"
        + (f" (Welch p={p:.3g})" if p is not None else "")
        + " (each picked on dev)"
    ]
    for m, mark in sorted(bb.get("marks", {}).items()):
        flags = (
            ("at chance", mark["random_at_chance"]),
            ("below the best random arm", mark["random_below_best_random"]),
        )
        why = [w for w, on in flags if on]
        if why:
            out.append(
                f"  note: {method_text(m)}'s random arm is {' and '.join(why)}: its margin overstates pretraining"
            )
    return out


def format_report(report: dict[str, Any]) -> str:
    lines = []
    if (
        report.get("baseline", {}).get("source") == "rerun"
    ):  # adapt continue: transfer.json measured otherwise
        lines.append(
            "baseline rerun under this protocol (the export's transfer.json differs in: "
            + ", ".join(report["baseline"]["differs"])
            + ")"
        )
    for name, r in report["tasks"].items():
        lines.append(
            f"{name}: {r['splits']['train']} train / {r['splits']['dev']} dev / {r['splits']['test']} test "
            + ("(regression, Pearson's r" if r.get("metric") == "pearsonr" else f"({len(r['labels'])} labels")
            + (", sentence pairs" if r.get("pair") else "")
            + f"; {r['origin']})"
        )
        for arm, e in r["arms"].items():
            n = len(e["test_accuracy"]["values"]) + len(e.get("collapsed", {}))
            probe_txt = f"   probe {e['probe_accuracy']:.3f}" if "probe_accuracy" in e else ""
            lines.append(
                f"  {arm:<10} {accuracy_text(e)}  (lr {e['lr']:g}, {seeds_text(n)}, {steps_text(e)}){probe_txt}"
            )
        for arm, e in r["arms"].items():
            if e.get("token_cosine", 0.0) > DEGENERATE_TOKEN_COSINE:
                lines.append(
                    f"  DEGENERATE {arm} body: token states' mean cosine {e['token_cosine']:.3f} (it ignores "
                    "its input)"
                )
        if r.get("collapsed"):
            lines.append(
                f"  COLLAPSED  {', '.join(r['collapsed'])}: a run predicted one class for >= "
                f"{COLLAPSE_PREDICTED_SHARE:.0%} of the test set; such runs are not in the means"
            )
        if "margin" in r:
            p = r.get("p_value")
            lines.append(
                f"  margin     {margin_text(r, r['margin'])}"
                + (f" (Welch p={p:.3g})" if p is not None else "")
                + (f", probe {margin_text(r, r['probe_margin'])}" if "probe_margin" in r else "")
            )
        lines += method_lines(r)
        lines += best_lines(r)
        if "continued" in r:  # ULMFiT's arm: the export continued on the task's training text
            c = r["continued"]
            p = c.get("p_value")
            lines.append(
                f"  {'continued':<10} {accuracy_text(c['arm'])}  (lr {c['arm']['lr']:g}; {c['export']})"
            )
            if "margin" in c:
                lines.append(
                    f"  continued  {margin_text(r, c['margin'])} over the export without it"
                    + (f" (Welch p={p:.3g})" if p is not None else "")
                )
    return "\n".join(lines)
