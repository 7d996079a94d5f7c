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


def test_adapt_finetune_prints_the_metric_by_name_and_a_singular_seed(tmp_path, capsys):
    """`adapt finetune` printed `sts: full/pretrained: pearsonr 0.123 (mean of 1 seeds)`."""
    import json

    from adapt.__main__ import main
    from tests.adapt.test_finetune import _export
    from tests.adapt.test_pairs_regression import _pair_rows, _write_jsonl

    rows = _pair_rows(per_label=8)
    export, overrides = _export(tmp_path, "roberta-tiny", [r["a"] + r["b"] for r in rows])
    path = _write_jsonl(tmp_path / "pairs.jsonl", rows, ("a", "b", "topic", "score"))
    task = {
        "name": "sts",
        "train": path,
        "text_column": "a",
        "text_pair_column": "b",
        "label_column": "score",
        "problem": "regression",
    }
    argv = [
        "finetune",
        "--config",
        "configs/roberta-tiny.yaml",
        "--model",
        str(export),
        "--init",
        "pretrained",
    ]
    assert main([*argv, *overrides, f"finetune.tasks={json.dumps([task])}"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("sts: ")]
    assert (
        "Pearson r " in line
        and "pearsonr" not in line
        and "(mean of 1 seed" in line
        and "1 seeds" not in line
    )
