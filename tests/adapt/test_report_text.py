"""Issue 66: at one seed the transfer report printed `± 0.000` and "1 seeds", and a regression task's margin in
"points". One seed prints no spread and "1 seed"; a regression margin is in the metric's own units (r)."""

from __future__ import annotations

from adapt.report import accuracy_text, format_report


def _arm(values: list[float]) -> dict:
    import statistics

    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "lr": 1e-4,
        "test_accuracy": {"mean": statistics.fmean(values), "sd": sd, "values": values},
        "steps": 10,
        "steps_by_seed": {str(i): 10 for i in range(len(values))},
    }


def _task(metric: str, pre: list[float], rnd: list[float]) -> dict:
    return {
        "splits": {"train": 10, "dev": 5, "test": 5},
        "labels": ["a", "b"],
        "origin": "files",
        "metric": metric,
        "arms": {"pretrained": _arm(pre), "random": _arm(rnd)},
        "margin": sum(pre) / len(pre) - sum(rnd) / len(rnd),
        "methods": {
            "lora": {
                "arms": {"pretrained": _arm(pre), "random": _arm(rnd)},
                "margin": sum(pre) / len(pre) - sum(rnd) / len(rnd),
            }
        },
    }


def test_one_seed_prints_no_spread_and_a_singular_seed():
    text = format_report({"tasks": {"topics": _task("accuracy", [0.8], [0.5])}})
    assert "±" not in text and "1 seeds" not in text and "1 seed," in text, text
    assert "margin     +30.0 points" in text and "lora margin +30.0 points" in text, text
    assert accuracy_text(_arm([0.8])) == "0.800"
    assert accuracy_text(_arm([0.8, 0.9])) == "0.850 ± 0.071"


def test_a_regression_margin_is_in_the_metrics_units():
    text = format_report({"tasks": {"sts": _task("pearsonr", [0.6, 0.62], [0.1, 0.12])}})
    assert "points" not in text, text
    assert "margin     +0.500 Pearson r" in text and "lora margin +0.500 Pearson r" in text, text
    assert "2 seeds" in text
