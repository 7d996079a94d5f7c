"""bench/transfer.py with replaced-token detection on ModernBERT's body (issue 46): the recipe's config validates as
the bench writes it, and the RTD-vs-MLM VERDICT compares the two recipes' fine-tuned accuracy at equal minutes
(goal RTD >= MLM), failing where an arm collapsed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _common as C  # noqa: E402
import transfer  # noqa: E402


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "RESULTS", tmp_path)
    return tmp_path


def test_rtd_recipe_runs_as_the_bench_writes_it_beside_its_mlm_peer(tmp_path):
    from runconfig import load_config

    cfgs = {}
    for recipe in ("modernbert-rtd-budget", "modernbert-budget"):
        path = tmp_path / f"{recipe}.yaml"
        path.write_text(transfer.run_yaml(recipe, tmp_path / recipe, 8.0, tmp_path, False))
        cfgs[recipe] = load_config(path)
    rtd, mlm = cfgs["modernbert-rtd-budget"], cfgs["modernbert-budget"]
    assert (rtd.objective.type, mlm.objective.type) == ("electra", "mlm")
    # everything but the objective and its peak LR is the same: body, data, batch, optimizer, budget, fine-tuning
    for section in ("model", "tokenizer", "packing", "batch", "schedule", "finetune", "data", "launch"):
        assert getattr(rtd, section) == getattr(mlm, section), section
    assert rtd.optim.model_copy(update={"lr": mlm.optim.lr}) == mlm.optim
    assert rtd.optim.lr < mlm.optim.lr  # at MLM's 2e-3 the discriminator's body turns anisotropic
    assert transfer.RTD_VS_MLM["modernbert-rtd-budget"][0] == "modernbert-budget"
    assert transfer.results_variant(["modernbert-rtd-budget", "modernbert-budget"], 8.0) == (
        "modernbert-rtd-budget_modernbert-budget"
    )


def _result(recipe: str, pretrained: float | None, random: float) -> dict:
    arms = {
        "pretrained": {"test_accuracy": {"mean": pretrained}},
        "random": {"test_accuracy": {"mean": random}},
    }
    task = {"arms": arms} | ({} if pretrained is None else {"margin": pretrained - random})
    return {"recipe": recipe, "tasks": {"bbc": task}}


@pytest.mark.parametrize(
    "rtd,mlm,outcome", [(0.90, 0.87, "pass"), (0.80, 0.87, "fail"), (None, 0.87, "fail")]
)
def test_rtd_vs_mlm_verdict(results, rtd, mlm, outcome):
    rep = C.Report("bench/example.py", save=False)
    transfer.rtd_vs_mlm(
        rep, [_result("modernbert-rtd-budget", rtd, 0.78), _result("modernbert-budget", mlm, 0.79)], ["bbc"]
    )
    (verdict,) = rep.verdicts
    assert verdict.startswith("VERDICT transfer_bbc_modernbert_rtd_vs_mlm: ") and verdict.endswith(outcome)
    assert any("modernbert-rtd-budget" in line and "modernbert-budget" in line for line in rep.lines)


def test_no_rtd_verdict_without_its_mlm_peer(results):
    rep = C.Report("bench/example.py", save=False)
    transfer.rtd_vs_mlm(rep, [_result("modernbert-rtd-budget", 0.9, 0.78)], ["bbc"])
    assert rep.verdicts == []
