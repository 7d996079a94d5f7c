"""Figures over seeds and between arms: mean ± sd of the kept runs, the margin and Welch's t-test p-value."""

from __future__ import annotations

import math
import statistics
from typing import Any


def mean_sd(xs: list[float]) -> dict[str, Any]:
    """Mean ± sd of the kept runs (None when no run is kept)."""
    if not xs:
        return {"mean": None, "sd": None, "values": []}
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "values": xs}


def aggregate_seeds(
    test_by_seed: dict[int, float], collapsed_by_seed: dict[int, dict[str, Any] | None]
) -> dict:
    """One arm's test figures over seeds: collapsed runs are listed by seed and kept out of the mean and sd."""
    kept = [acc for seed, acc in test_by_seed.items() if not collapsed_by_seed.get(seed)]
    out: dict[str, Any] = {"test_accuracy": mean_sd(kept)}
    bad = {str(seed): c for seed, c in collapsed_by_seed.items() if c}
    if bad:
        out["collapsed"] = bad
        out["collapsed_accuracy"] = {
            str(seed): test_by_seed[seed] for seed in collapsed_by_seed if collapsed_by_seed[seed]
        }
    return out


def compare_arms(result: dict[str, Any], probe_on: bool) -> None:
    """Margin and Welch p over the kept runs of both arms; a task with any collapsed run says so
    (`collapsed`: the arms concerned), and gets no margin when an arm has no kept run."""
    arms = result["arms"]
    result["collapsed"] = sorted(a for a, e in arms.items() if e.get("collapsed"))
    if not {"pretrained", "random"} <= set(arms):
        return
    pre, rnd = arms["pretrained"]["test_accuracy"], arms["random"]["test_accuracy"]
    if pre["mean"] is not None and rnd["mean"] is not None:
        result["margin"] = pre["mean"] - rnd["mean"]
        result["p_value"] = welch_p(pre["values"], rnd["values"])
    if probe_on:
        result["probe_margin"] = arms["pretrained"]["probe_accuracy"] - arms["random"]["probe_accuracy"]


def welch_p(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import ttest_ind

    if statistics.pstdev(a) == 0 and statistics.pstdev(b) == 0:
        return 0.0 if statistics.fmean(a) != statistics.fmean(b) else 1.0
    p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p
