"""Fine-tunes that fail say so (issue 27, item 3): a run that predicts one class for >= 95% of an evaluation
split, where that class is < 80% of its labels, is marked collapsed, kept out of the means and the margin,
printed as such, and never picked as the dev-best learning rate."""

from __future__ import annotations

import numpy as np
import pytest

from adapt.report import format_report
from adapt.scoring import collapse, pick_lr
from adapt.statistics import aggregate_seeds, compare_arms


def _preds(n: int, share_of_zero: float) -> np.ndarray:
    k = round(n * share_of_zero)
    return np.array([0] * k + [1 + i % 4 for i in range(n - k)])


def test_one_class_for_most_examples_is_collapsed_unless_the_labels_are_that_skewed():
    gold = np.array([i % 5 for i in range(200)])  # 20% per class
    c = collapse(np.zeros(200, dtype=int), gold)
    assert c == {"class": 0, "predicted_share": 1.0, "label_share": 0.2}
    # the threshold is inclusive
    assert collapse(_preds(200, 0.95), gold)["predicted_share"] == pytest.approx(0.95)
    assert collapse(_preds(200, 0.94), gold) is None  # 94% one class: a poor run, not a collapsed one
    assert collapse(gold.copy(), gold) is None
    # the predicted class is 80% of the labels: predicting it is no collapse
    skewed = np.array([0] * 160 + [1] * 40)
    assert collapse(np.zeros(200, dtype=int), skewed) is None
    under = np.array([0] * 159 + [1] * 41)  # 79.5%: collapsed
    assert collapse(np.zeros(200, dtype=int), under)["label_share"] == pytest.approx(0.795)
    assert collapse(np.array([], dtype=int), np.array([], dtype=int)) is None


def test_collapsed_seeds_are_kept_out_of_the_mean_and_named():
    c = {"class": 2, "predicted_share": 1.0, "label_share": 0.185}
    agg = aggregate_seeds({0: 0.80, 1: 0.185, 2: 0.70}, {0: None, 1: c, 2: None})
    assert agg["test_accuracy"]["values"] == [0.80, 0.70]
    assert agg["test_accuracy"]["mean"] == pytest.approx(0.75)
    assert agg["collapsed"] == {"1": c} and agg["collapsed_accuracy"] == {"1": 0.185}
    every = aggregate_seeds({0: 0.185, 1: 0.185}, {0: c, 1: c})
    assert every["test_accuracy"] == {"mean": None, "sd": None, "values": []}
    clean = aggregate_seeds({0: 0.8, 1: 0.7}, {0: None, 1: None})
    assert "collapsed" not in clean and clean["test_accuracy"]["mean"] == pytest.approx(0.75)


def _task(pre: dict, rnd: dict) -> dict:
    return {
        "splits": {"train": 10, "dev": 2, "test": 5},
        "labels": ["a", "b"],
        "origin": "x",
        "arms": {
            "pretrained": {"lr": 1e-4, **pre, "probe_accuracy": 0.5},
            "random": {"lr": 1e-3, **rnd, "probe_accuracy": 0.4},
        },
    }


def test_margin_over_kept_runs_and_a_task_with_a_collapsed_arm_says_so():
    c = {"class": 0, "predicted_share": 1.0, "label_share": 0.185}
    ok = aggregate_seeds({0: 0.8, 1: 0.7}, {0: None, 1: None})
    r = _task(aggregate_seeds({0: 0.185, 1: 0.185}, {0: c, 1: c}), ok)
    compare_arms(r, probe_on=True)
    assert r["collapsed"] == ["pretrained"] and "margin" not in r and "p_value" not in r
    assert r["probe_margin"] == pytest.approx(0.1)
    text = format_report({"tasks": {"bbc": r}})
    assert "pretrained collapsed (every seed: 0, 1)" in text and "COLLAPSED  pretrained" in text
    assert "margin" not in text
    partly = _task(aggregate_seeds({0: 0.9, 1: 0.185}, {0: None, 1: c}), ok)
    compare_arms(partly, probe_on=False)
    assert partly["collapsed"] == ["pretrained"] and partly["margin"] == pytest.approx(0.9 - 0.75)
    assert "collapsed seeds 1 left out" in format_report({"tasks": {"bbc": partly}})
    fine = _task(ok, ok)
    compare_arms(fine, probe_on=False)
    assert (
        fine["collapsed"] == []
        and fine["margin"] == 0.0
        and "COLLAPSED" not in format_report({"tasks": {"t": fine}})
    )


def test_a_collapsed_dev_run_is_never_the_picked_learning_rate():
    grid = [1e-4, 3e-4, 1e-3]
    # a collapsed run can score a higher dev accuracy than a working one when one class dominates dev
    assert pick_lr(grid, {1e-4: 0.40, 3e-4: 0.35, 1e-3: 0.45}, {1e-3: True}) == 1e-4
    assert pick_lr(grid, {1e-4: 0.40, 3e-4: 0.40, 1e-3: 0.30}, {}) == 1e-4  # ties: the first in the grid
    assert pick_lr(grid, {1e-4: 0.2, 3e-4: 0.3, 1e-3: 0.2}, dict.fromkeys(grid, True)) == 3e-4


def test_bench_transfer_fails_the_verdict_of_a_task_with_a_collapsed_run(capsys):
    """bench/transfer.py: the table cell says 'collapsed', and the recipe's VERDICT on that task fails even where
    the runs that did not collapse show a margin above the goal."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import _common as C
    import transfer as bench

    c = {"class": 0, "predicted_share": 1.0, "label_share": 0.185}
    good = aggregate_seeds({0: 0.9, 1: 0.9}, {0: None, 1: None})
    low = aggregate_seeds({0: 0.5, 1: 0.5}, {0: None, 1: None})
    rep = C.Report("bench/example.py", save=False)
    partly = _task(aggregate_seeds({0: 0.9, 1: 0.185}, {0: None, 1: c}), low)
    compare_arms(partly, probe_on=False)
    assert partly["margin"] == pytest.approx(0.4) and not bench.verdict_margin(rep, "t_partly", partly)
    assert rep.verdicts[-1].endswith("fail") and "collapsed runs: pretrained" in rep.verdicts[-1]
    every = _task(aggregate_seeds({0: 0.185}, {0: c}), low)
    compare_arms(every, probe_on=False)
    assert not bench.verdict_margin(rep, "t_every", every)
    assert "ours=collapsed peer=0.500" in rep.verdicts[-1]
    assert bench.arm_cell(every["arms"]["pretrained"]) == "collapsed"
    assert bench.arm_cell(partly["arms"]["pretrained"]) == "0.900±0.000(1c)"
    fine = _task(good, low)
    compare_arms(fine, probe_on=False)
    assert bench.verdict_margin(rep, "t_fine", fine) and rep.verdicts[-1].endswith("pass")


def test_a_body_that_ignores_its_input_is_flagged_by_its_token_cosine():
    """The evidence behind ELECTRA's and T5's pretrained collapse: their exported bodies map every token to
    (nearly) the same vector. A post-LN encoder whose last LayerNorm gain went to zero (output = its bias, what
    an encoder stuck on its prior converges to) is flagged; the same encoder from random init is not."""
    import torch
    from transformers import ElectraConfig, ElectraModel

    from adapt.probes import DEGENERATE_TOKEN_COSINE, token_cosine
    from runconfig.finetune import FinetuneConfig
    from tests.adapt.tiny_text import TINY_ELECTRA, word_examples, word_tokenizer

    tok = word_tokenizer()
    enc = word_examples(tok, 16, np.zeros(16, dtype=int))
    torch.manual_seed(0)
    body = ElectraModel(ElectraConfig(**TINY_ELECTRA))
    ft = FinetuneConfig()
    healthy = token_cosine(body, tok, enc, ft)
    assert healthy < DEGENERATE_TOKEN_COSINE
    with torch.no_grad():
        body.encoder.layer[-1].output.LayerNorm.weight.zero_()
        body.encoder.layer[-1].output.LayerNorm.bias.normal_()
    assert token_cosine(body, tok, enc, ft) == pytest.approx(1.0, abs=1e-5)
