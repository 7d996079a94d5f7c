"""bench/transfer.py over several pretraining runs (issue 46): the spread between two pretraining runs of one RTD
recipe (BBC -11.2 and +3.3 points) was wider than three fine-tune seeds of one run show, so `--pretrain-seeds`
pretrains each recipe once per seed and judges the pooled runs. The run YAML carries the seed; the pooled report
keeps every fine-tune run (named '<pretraining seed>/<fine-tune seed>' where one collapsed) and its margin is the
pooled means' difference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import transfer  # noqa: E402


def test_the_run_yaml_carries_the_pretraining_seed(tmp_path):
    from runconfig import load_config

    path = tmp_path / "r.yaml"
    path.write_text(transfer.run_yaml("gpt2-budget", tmp_path / "r", 8.0, tmp_path, False, pretrain_seed=7))
    assert load_config(path).run.seed == 7
    path.write_text(transfer.run_yaml("gpt2-budget", tmp_path / "r", 8.0, tmp_path, False))
    assert (
        load_config(path).run.seed == load_config(transfer.C.ROOT / "configs" / "gpt2-budget.yaml").run.seed
    )
    assert transfer.results_variant(transfer.RECIPES, 8.0, pretrain_seeds=3) == "3pretrain-seeds"
    assert transfer.results_variant(["gpt2-budget"], 8.0, pretrain_seeds=1) == "gpt2-budget"


def _arm(values: list[float], collapsed: dict | None = None, probe: float = 0.5) -> dict:
    from adapt.statistics import mean_sd

    e = {"test_accuracy": mean_sd(values), "probe_accuracy": probe, "token_cosine": 0.4}
    if collapsed:
        e["collapsed"] = collapsed
    return e


def _run(seed: int, pre: list[float], rnd: list[float], collapsed: dict | None = None) -> dict:
    task = {
        "lr_grid": [1e-4],
        "optim": "adamw",
        "arms": {"pretrained": _arm(pre, collapsed), "random": _arm(rnd)},
    }
    return {
        "recipe": "r",
        "pretrain_seed": seed,
        "tokens": 1000 * seed,
        "steps": 10,
        "eval_loss": float(seed),
        "tasks": {"bbc": task},
    }


def test_pooled_runs_keep_every_fine_tune_and_compare_the_pooled_means():
    pooled = transfer.pool_pretraining_runs(
        [_run(1, [0.8, 0.7], [0.6, 0.6]), _run(2, [0.5, 0.6], [0.6, 0.5])]
    )
    t = pooled["tasks"]["bbc"]
    assert t["arms"]["pretrained"]["test_accuracy"]["values"] == [0.8, 0.7, 0.5, 0.6]
    assert t["margin"] == pytest.approx(0.65 - 0.575) and t["p_value"] is not None
    assert t["arms"]["pretrained"]["probe_accuracy"] == pytest.approx(0.5) and t["collapsed"] == []
    assert (
        pooled["tokens"] == 1500
        and pooled["eval_loss"] == pytest.approx(1.5)
        and pooled["pretrain_seeds"] == [1, 2]
    )
    assert t["lr_grid"] == [1e-4]


def test_a_collapsed_run_of_any_pretraining_seed_is_named_and_kept_out_of_the_mean():
    runs = [_run(1, [0.8, 0.7], [0.6, 0.6]), _run(2, [0.5], [0.6, 0.5], collapsed={"1": {"class": 0}})]
    t = transfer.pool_pretraining_runs(runs)["tasks"]["bbc"]
    assert t["collapsed"] == ["pretrained"] and t["arms"]["pretrained"]["collapsed"] == {"2/1": {"class": 0}}
    assert t["arms"]["pretrained"]["test_accuracy"]["values"] == [0.8, 0.7, 0.5]
