"""The transfer report's decision: the best adaptation method from the export against the best from random init,
each picked on dev, with the margin and Welch's p; a method whose random arm is at chance (or below the best
random arm) is marked, since its own margin overstates what pretraining buys."""

from __future__ import annotations

import pytest

from adapt.report import format_report
from adapt.statistics import best_against_best
from pretrain.export.model_card import best_against_best_lines

pytestmark = pytest.mark.timeout(60)


def _arm(dev: float, test: list[float], lr: float = 1e-3) -> dict:
    mean = sum(test) / len(test)
    return {
        "lr": lr,
        "dev_accuracy_by_lr": {f"{lr:g}": dev},
        "steps": 10,
        "steps_by_seed": {"0": 10},
        "test_accuracy": {"mean": mean, "sd": 0.01, "values": test},
    }


def _task() -> dict:
    return {
        "task": "news",
        "labels": ["a", "b", "c", "d"],
        "metric": "accuracy",
        "primary_method": "full",
        "splits": {"train": 80, "dev": 20, "test": 40},
        "origin": "files",
        # full fine-tuning: the random arm learned nothing (4 classes: chance 0.25)
        "arms": {"pretrained": _arm(0.80, [0.84, 0.86, 0.85]), "random": _arm(0.30, [0.25, 0.26, 0.24])},
        "methods": {
            "lora": {
                "arms": {
                    "pretrained": _arm(0.90, [0.90, 0.91, 0.89]),
                    "random": _arm(0.70, [0.69, 0.71, 0.70]),
                }
            }
        },
    }


def test_each_side_s_best_is_picked_on_dev_and_chance_is_marked():
    task = _task()
    bb = best_against_best(task)
    assert bb["pretrained"]["method"] == "lora" and bb["random"]["method"] == "lora"
    assert bb["margin"] == pytest.approx(0.20) and bb["p_value"] < 0.01
    assert bb["marks"]["full"] == {"random_at_chance": True, "random_below_best_random": True}
    assert bb["marks"]["lora"] == {"random_at_chance": False, "random_below_best_random": False}
    # dev decides, not test: a method better on test but worse on dev is not picked
    task["methods"]["lora"]["arms"]["pretrained"] = _arm(0.75, [0.95, 0.95, 0.95])
    assert best_against_best(task)["pretrained"]["method"] == "full"


def test_the_report_and_the_card_lead_with_it():
    task = _task()
    task["best_against_best"] = best_against_best(task)
    text = format_report({"tasks": {"news": task}})
    assert "best vs best" in text and "+20.0 points" in text and "(each picked on dev)" in text
    assert "random arm is at chance and below the best random arm" in text
    card = "\n".join(best_against_best_lines({"tasks": {"news": task}}))
    assert card.startswith("Best against best") and "**news**" in card and "+20.0 points" in card
