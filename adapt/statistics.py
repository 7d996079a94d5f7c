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


# A random-init arm within this many points of chance is marked "at chance": its margin says little about the
# pretraining, since the arm learned nothing.
CHANCE_SLACK = 0.02


def chance_level(result: dict[str, Any]) -> float:
    """What guessing scores on the task: 1 / classes for accuracy, 0 for a correlation."""
    return 0.0 if result.get("metric") == "pearsonr" else 1.0 / max(1, len(result.get("labels") or []))


def _dev_score(entry: dict[str, Any]) -> float | None:
    """The dev figure the arm's LR was picked on (its first seed), which is what picks between methods too."""
    try:
        return float(entry["dev_accuracy_by_lr"][f"{entry['lr']:g}"])
    except (KeyError, TypeError, ValueError):
        return None


def best_against_best(result: dict[str, Any]) -> dict[str, Any] | None:
    """The decision a task's report gives: the best adaptation method of the pretrained export against the best
    of random init, each picked on dev (never on test), with the test margin and Welch's p. Each method's random
    arm is marked where it is at chance or below the best random arm (the per-method margins against it
    overstate what pretraining buys). None with fewer than one method per arm scored."""
    methods = {"": result.get("arms", {})} | {
        m: v.get("arms", {}) for m, v in result.get("methods", {}).items()
    }
    picks: dict[str, tuple[str, dict[str, Any]]] = {}
    for arm in ("pretrained", "random"):
        scored = []
        for m, arms in methods.items():
            entry = arms.get(arm)
            score = _dev_score(entry) if entry else None
            if score is not None and entry["test_accuracy"]["mean"] is not None:
                scored.append((score, m, entry))
        if not scored:
            return None
        _, m, entry = max(scored, key=lambda t: t[0])
        picks[arm] = (m, entry)
    (pm, pe), (rm, re_) = picks["pretrained"], picks["random"]
    primary = result.get("primary_method", "full")
    chance = chance_level(result)
    best_random = re_["test_accuracy"]["mean"]
    marks = {}
    for m, arms in methods.items():
        rnd = (arms.get("random") or {}).get("test_accuracy", {}).get("mean")
        if rnd is not None:
            marks[m or primary] = {
                "random_at_chance": rnd <= chance + CHANCE_SLACK,
                "random_below_best_random": rnd < best_random,
            }
    pre_t, rnd_t = pe["test_accuracy"], re_["test_accuracy"]
    return {
        "pretrained": {"method": pm or primary, "dev": _dev_score(pe), "test": pre_t["mean"]},
        "random": {"method": rm or primary, "dev": _dev_score(re_), "test": rnd_t["mean"]},
        "margin": pre_t["mean"] - rnd_t["mean"],
        "p_value": welch_p(pre_t["values"], rnd_t["values"]),
        "chance": chance,
        "marks": marks,
    }
