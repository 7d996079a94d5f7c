"""Scoring one run honestly: the collapse check (one class predicted for nearly everything), a run's scores, and
the LR picked on dev (a collapsed dev run is never the pick)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# A fine-tune that predicts one class for at least this share of an evaluation split, where that class is below
# COLLAPSE_LABEL_SHARE of the split's labels, has collapsed (learned the prior, not the task): it is reported as
# such, kept out of the means and the margin, and never picked as the dev-best LR.
COLLAPSE_PREDICTED_SHARE = 0.95


COLLAPSE_LABEL_SHARE = 0.80


def collapse(pred: np.ndarray, gold: np.ndarray, regression: bool = False) -> dict[str, Any] | None:
    """None, or why the predictions count as collapsed: one class predicted for >= 95% of the examples while
    that class is < 80% of the gold labels (a majority-class task may legitimately be answered mostly one way);
    for regression, one value predicted for every example (the label's mean learned, not the task)."""
    if len(pred) == 0:
        return None
    if regression:
        if float(np.ptp(pred)) <= 1e-6 * max(1.0, float(np.abs(pred).max())) and float(np.ptp(gold)) > 0:
            return {"constant": round(float(pred[0]), 6)}
        return None
    classes, counts = np.unique(pred, return_counts=True)
    top = int(classes[counts.argmax()])
    predicted = float(counts.max() / len(pred))
    label = float((gold == top).mean())
    if predicted >= COLLAPSE_PREDICTED_SHARE and label < COLLAPSE_LABEL_SHARE:
        return {"class": top, "predicted_share": round(predicted, 4), "label_share": round(label, 4)}
    return None


# The metric a task is scored by: what the results' `accuracy` figures hold (the dev pick and the margin use it)
# and the model card's model-index metric type.
ACCURACY, PEARSON, SPEARMAN = "accuracy", "pearsonr", "spearmanr"


def task_metric(regression: bool) -> str:
    return PEARSON if regression else ACCURACY


def score(pred: np.ndarray, gold: np.ndarray, regression: bool = False) -> float:
    """Accuracy, or for regression Pearson's r (0 where it is undefined: constant predictions or labels)."""
    if not regression:
        return float((pred == gold).mean()) if len(gold) else 0.0
    return _corr(pred, gold, PEARSON)


def spearman(pred: np.ndarray, gold: np.ndarray) -> float:
    return _corr(pred, gold, SPEARMAN)


def _corr(pred: np.ndarray, gold: np.ndarray, kind: str) -> float:
    from scipy.stats import pearsonr, spearmanr

    if len(gold) < 2 or np.ptp(pred) == 0 or np.ptp(gold) == 0:
        return 0.0
    r = (pearsonr if kind == PEARSON else spearmanr)(pred, gold)[0]
    return 0.0 if np.isnan(r) else float(r)


@dataclass
class RunScore:
    """One fine-tune's outcome per evaluation split: accuracy, and the collapse finding where it collapsed."""

    accuracy: dict[str, float]  # the task's metric per split: accuracy, or Pearson's r for regression
    collapsed: dict[str, dict[str, Any]]
    steps: int  # optimizer steps taken (fewer than planned where early stopping ended the run)
    spearman: dict[str, float] | None = None  # regression: Spearman's rho per split


def pick_lr(grid: list[float], dev_acc: dict[float, float], dev_collapsed: dict[float, bool]) -> float:
    """The dev-best LR: a run that collapsed on dev is never preferred to one that did not; ties: the first."""
    return max(grid, key=lambda x: (not dev_collapsed.get(x, False), dev_acc[x], -grid.index(x)))
