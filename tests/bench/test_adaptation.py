"""bench/adaptation.py (issue 48 items 8-9): its run YAMLs load as written (every method, BBC held out, a token
budget as a step count), its VERDICTs say which budget they hold at and judge what the issue asks (LoRA within 3
points of full, each method's pretrained arm +5 over random, ULMFiT continued pretraining 'not run' rather than
faked), bench/transfer.py's token budget, and (integration) the smoke mode runs the whole path at tiny size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import _common as C  # noqa: E402
import adaptation as A  # noqa: E402
import transfer as T  # noqa: E402


@pytest.mark.parametrize("smoke", [False, True])
def test_run_yaml_loads_with_every_method_and_bbc_held_out(tmp_path, smoke):
    from runconfig import load_config

    for recipe in ("gpt2-tiny", "modernbert-tiny") if smoke else A.RECIPES:
        path = tmp_path / f"{recipe}.yaml"
        path.write_text(A.run_yaml(recipe, tmp_path / recipe, 8.0, A.SMOKE_TOKENS if smoke else None, smoke))
        cfg = load_config(path)
        assert cfg.finetune.methods == A.METHODS
        (task,) = cfg.finetune.tasks
        assert task.source == "bbc"
        bbc = next(s for s in cfg.data.sources if s.name == "bbc")
        assert bbc.holdout_fraction > 0 and bbc.label_from_folder  # BBC's test text is never pretrained on
        if smoke:
            assert cfg.schedule.total_steps == 20 and cfg.schedule.budget_minutes is None
        else:
            assert cfg.schedule.budget_minutes == 8.0 and cfg.finetune.seeds == [0, 1, 2]
            assert {s.name for s in cfg.data.sources} == {"crawl", "bbc"}  # the demo corpus


def test_a_token_budget_is_a_step_count_from_the_recipe_whatever_the_host(tmp_path):
    from runconfig import load_config

    per_step = T.tokens_per_step("modernbert-budget")
    cfg_path = tmp_path / "r.yaml"
    cfg_path.write_text(A.run_yaml("modernbert-budget", tmp_path / "r", 8.0, 8.1e6, False))
    cfg = load_config(cfg_path)
    assert cfg.schedule.budget_minutes is None
    assert cfg.schedule.total_steps == -(-8_100_000 // per_step)  # rounded up to a whole step
    assert cfg.schedule.total_steps * per_step >= 8.1e6 > (cfg.schedule.total_steps - 1) * per_step
    assert T.budget_label(8.0, 8.1e6) == "8.1Mtok" and T.budget_label(8.0, None) == "8min"
    assert A.results_variant(A.RECIPES, 8.0, None) is None
    assert A.results_variant(A.RECIPES, 8.0, 8.1e6) == "8.1Mtok"
    assert T.results_variant(["modernbert-budget"], 8.0, tokens=8.1e6) == "modernbert-budget-8.1Mtok"
    # bench/transfer.py writes the same schedule for the same budget
    t_path = tmp_path / "t.yaml"
    t_path.write_text(T.run_yaml("modernbert-budget", tmp_path / "t", 8.0, tmp_path, False, tokens=8.1e6))
    assert load_config(t_path).schedule.total_steps == cfg.schedule.total_steps


def _arm(mean: float | None, collapsed: bool = False) -> dict:
    e = {"test_accuracy": {"mean": mean, "sd": 0.01, "values": [] if mean is None else [mean] * 3}}
    if collapsed:
        e["collapsed"] = {"1": {"class": 0}}
    return e


def _task(full=(0.80, 0.70), lora=(0.78, 0.70), frozen=(0.60, 0.40), ulmfit=(0.81, 0.70)) -> dict:
    def method(pre, rnd):
        return {
            "arms": {"pretrained": _arm(pre), "random": _arm(rnd)},
            "margin": pre - rnd,
            "p_value": 0.01,
            "collapsed": [],
        }

    task = method(*full)
    task["methods"] = {"lora": method(*lora), "frozen": method(*frozen), "ulmfit": method(*ulmfit)}
    frozen_pre = task["methods"]["frozen"]["arms"]["pretrained"]
    frozen_pre.update(
        best_layer=2,
        best_layer_test_accuracy=0.66,
        last_layer_test_accuracy=0.61,
        layers=[{"layer": i} for i in range(5)],
    )
    return task


def _verdicts(task: dict, at: str = "8.1Mtok") -> dict[str, str]:
    rep = C.Report("bench/adaptation.py", save=False)
    A.verdicts(rep, "gpt2-budget", task, at)
    return {v.split(":")[0].removeprefix("VERDICT "): v for v in rep.verdicts}


def test_verdicts_name_their_budget_and_judge_what_the_issue_asks():
    v = _verdicts(_task())
    assert all(name.endswith("_at_8.1Mtok") for name in v)
    assert v["adaptation_lora_vs_full_gpt2-budget_at_8.1Mtok"].endswith(" pass")  # 2 points below full
    for method, outcome in (("full", "pass"), ("lora", "pass"), ("frozen", "pass"), ("ulmfit", "pass")):
        assert v[f"adaptation_{method}_gpt2-budget_pretrained_vs_random_init_at_8.1Mtok"].endswith(outcome)
    continued = v["adaptation_ulmfit_continued_gpt2-budget_at_8.1Mtok"]
    assert "not run" in continued and continued.endswith(" fail") and "ours=n/a" in continued
    task = _task()  # the export continued on BBC's training text, 2 points over the export without it
    task["continued"] = {"arm": _arm(0.82), "margin": 0.02, "p_value": 0.03, "steps": 50}
    continued = _verdicts(task)["adaptation_ulmfit_continued_gpt2-budget_at_8.1Mtok"]
    assert "ours=0.820 peer=0.800" in continued and "goal=+1pt" in continued and continued.endswith(" pass")
    task["continued"] = {"arm": _arm(0.805), "margin": 0.005, "p_value": 0.6, "steps": 50}
    assert _verdicts(task)["adaptation_ulmfit_continued_gpt2-budget_at_8.1Mtok"].endswith(" fail")
    task["continued"] = {"arm": _arm(None, collapsed=True), "steps": 50}
    continued = _verdicts(task)["adaptation_ulmfit_continued_gpt2-budget_at_8.1Mtok"]
    assert "collapsed" in continued and continued.endswith(" fail")
    v = _verdicts(_task(lora=(0.76, 0.74), frozen=(0.50, 0.48)))
    assert v["adaptation_lora_vs_full_gpt2-budget_at_8.1Mtok"].endswith(" fail")  # 4 points below full
    assert v["adaptation_lora_gpt2-budget_pretrained_vs_random_init_at_8.1Mtok"].endswith(" fail")
    assert v["adaptation_frozen_gpt2-budget_pretrained_vs_random_init_at_8.1Mtok"].endswith(" fail")


def test_a_collapsed_or_missing_method_fails_its_verdicts():
    task = _task()
    task["methods"]["lora"]["arms"]["pretrained"] = _arm(None, collapsed=True)
    task["methods"]["lora"]["collapsed"] = ["pretrained"]
    del task["methods"]["ulmfit"]
    v = _verdicts(task, "8min")
    assert v["adaptation_lora_vs_full_gpt2-budget_at_8min"].endswith(" fail")
    assert v["adaptation_lora_gpt2-budget_pretrained_vs_random_init_at_8min"].endswith(" fail")
    assert v["adaptation_ulmfit_gpt2-budget_pretrained_vs_random_init_at_8min"].endswith("(not run) fail")


def test_table_has_a_row_per_method_and_the_best_layer_beside_the_last():
    lines = A.table_lines("gpt2-budget", _task())
    assert [ln.split()[0] for ln in lines[2:]] == A.METHODS
    task = _task()
    task["continued"] = {"arm": _arm(0.82), "margin": 0.02, "p_value": 0.03, "steps": 50}
    row = A.table_lines("gpt2-budget", task)[-1]
    assert row.split()[0] == "continued" and "0.820±0.010" in row and "+2.0" in row and "0.030" in row
    assert "50 steps" in row
    assert "0.800±0.010" in lines[2] and "+10.0" in lines[2]
    (layer,) = A.layer_lines("gpt2-budget", _task())
    assert "best probed layer 2" in layer and "0.660" in layer and "last layer (4) 0.610" in layer


def test_transfer_verdicts_say_their_budget(tmp_path):
    rep = C.Report("bench/transfer.py", save=False)
    task = _task()
    T.verdict_margin(rep, f"transfer_bbc_gpt2-budget_vs_random_init_at_{T.budget_label(8.0, 8.1e6)}", task)
    assert rep.verdicts[0].startswith("VERDICT transfer_bbc_gpt2-budget_vs_random_init_at_8.1Mtok: ")


# One recipe: the bench's own code is the same for every family, and each method runs for every family in
# tests/adapt/test_methods.py; the second recipe here took about 170 s of CI for no line of the bench not run.
@pytest.mark.integration  # data stages, a 2-rank pretraining run, export, 4 methods x 2 arms, continued
@pytest.mark.deepspeed
@pytest.mark.timeout(1500)  # on 2 cores shared with 7 other jobs; a quiet machine takes a few minutes
def test_adaptation_bench_smoke_runs_the_whole_path():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        [sys.executable, "bench/adaptation.py", "--smoke", "--recipes", "modernbert-budget"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1480,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "SMOKE adaptation: ran 1 of 1 recipes" in out
    for recipe in ("modernbert-tiny",):
        assert f"{recipe}: BBC topic, test accuracy" in out
        for method in A.METHODS:
            assert f"VERDICT adaptation_{method}_{recipe}_pretrained_vs_random_init_at_0.0819Mtok: " in out
        assert f"{recipe} pretrained: best probed layer" in out
        # ULMFiT's second stage ran: the export continued on BBC's training text, fine-tuned, judged
        assert f"VERDICT adaptation_ulmfit_continued_{recipe}_at_0.0819Mtok: " in out
    assert "continued pretraining FAILED" not in out and "(not run)" not in out
    assert out.count("  continued ") == 1  # its row in the recipe's table
    assert "wrote " not in out  # a smoke run writes no results file
