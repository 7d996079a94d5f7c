"""Batch plan, LR scaling rules, warmup/decay shape, generated DeepSpeed config, memory plan."""

import math
from pathlib import Path

import pytest

from pretrain.run.engine import build_ds_config
from pretrain.run.schedule import WarmupDecay, make_plan
from pretrain.tools.plan import plan_report
from runconfig import load_config


def test_grad_accum_derived_from_world_size():
    cfg = load_config("configs/demo.yaml")
    assert make_plan(cfg, 1).grad_accum == 4
    assert make_plan(cfg, 2).grad_accum == 2
    assert make_plan(cfg, 4).grad_accum == 1
    with pytest.raises(ValueError, match="not divisible"):
        make_plan(cfg, 3)


def test_global_batch_in_tokens():
    cfg = load_config("configs/demo.yaml", ["batch.global_batch_tokens=8192"])
    plan = make_plan(cfg, 2)
    assert plan.global_batch_size == 64 and plan.tokens_per_step == 8192 and plan.grad_accum == 4


@pytest.mark.parametrize("rule,expected_lr", [("linear", 1e-4 * 32), ("sqrt", 1e-4 * math.sqrt(32))])
def test_lr_scaling_rules(rule, expected_lr):
    cfg = load_config(
        "configs/roberta-base.yaml",
        [
            f"lr_scaling.rule={rule}",
            "lr_scaling.reference_batch_size=256",
            "lr_scaling.reference_lr=1e-4",
            "lr_scaling.reference_warmup_steps=10000",
        ],
    )
    plan = make_plan(cfg)
    assert plan.peak_lr == pytest.approx(expected_lr)
    assert plan.warmup_steps == round(10000 / 32)  # same number of warmup samples as the reference


def test_lr_scaling_cap():
    cfg = load_config(
        "configs/roberta-base.yaml",
        ["lr_scaling.rule=linear", "lr_scaling.max_lr=1e-3", "batch.global_batch_size=32768"],
    )
    assert make_plan(cfg).peak_lr == 1e-3


def test_lr_scaling_keeps_the_preset_recipe_and_says_what_it_applies(capsys):
    """The README's `plan --config configs/roberta-base.yaml launch.nodes=8 lr_scaling.rule=sqrt` keeps RoBERTa's
    6e-4 / 24K warmup at its own batch (it used to print 5.66e-4 and 312 from hidden defaults)."""
    from pretrain.__main__ import main

    assert (
        main(["plan", "--config", "configs/roberta-base.yaml", "launch.nodes=8", "lr_scaling.rule=sqrt"]) == 0
    )
    out = capsys.readouterr().out
    assert "peak LR           0.0006 (rule: sqrt)" in out and "warmup            24000 of 500000 steps" in out
    assert (
        "lr_scaling: reference recipe LR 0.0006 (optim.lr), warmup 24000 steps (schedule.warmup_steps) at "
        "global batch 8192 (lr_scaling.reference_batch_size)"
    ) in out
    assert (
        "lr_scaling: rule sqrt: batch 8192 = 1 x reference -> LR x 1 = 0.0006, warmup / 1 = 24000 steps"
        in out
    )
    assert "warning" not in out

    # A smaller batch scales the recipe, and the values written in the YAML being replaced is said out loud.
    cfg = load_config("configs/roberta-base.yaml", ["lr_scaling.rule=sqrt", "batch.global_batch_size=2048"])
    r = plan_report(cfg)
    assert r["plan"]["peak_lr"] == pytest.approx(3e-4) and r["plan"]["warmup_steps"] == 96000
    assert r["warnings"] == [
        "warning: optim.lr 0.0006 set in the config is replaced by 0.0003 from lr_scaling.rule=sqrt; set "
        "lr_scaling.rule=none to keep it",
        "warning: schedule.warmup_steps 24000 set in the config is replaced by 96000 from lr_scaling.rule=sqrt; set "
        "lr_scaling.rule=none to keep it",
    ]
    assert plan_report(load_config("configs/roberta-base.yaml"))["lr_scaling"] == [
        "lr_scaling: none (peak LR 0.0006 = optim.lr, warmup 24000 = schedule.warmup_steps)"
    ]


def test_lr_scaling_needs_a_stated_reference_batch():
    with pytest.raises(
        Exception, match="lr_scaling.reference_batch_size: required with lr_scaling.rule=linear"
    ):
        load_config("configs/roberta-tiny.yaml", ["lr_scaling.rule=linear"])


def test_warmup_then_linear_and_cosine_decay():
    lin = WarmupDecay(10, 110, "linear", 0.0)
    assert lin(0) == pytest.approx(0.1) and lin(9) == pytest.approx(1.0)
    assert lin(60) == pytest.approx(0.5) and lin(110) == pytest.approx(0.0)
    cos = WarmupDecay(0, 100, "cosine", 0.1)
    assert cos(0) == pytest.approx(1.0) and cos(50) == pytest.approx(0.55) and cos(100) == pytest.approx(0.1)


def test_ds_config_generated_from_yaml():
    cfg = load_config("configs/demo.yaml", ["deepspeed.precision=fp16", "optim.grad_clip=0.5"])
    conf = build_ds_config(cfg, make_plan(cfg, 2))
    assert conf["train_batch_size"] == 32 and conf["train_micro_batch_size_per_gpu"] == 8
    assert conf["gradient_accumulation_steps"] == 2 and conf["gradient_clipping"] == 0.5
    assert conf["zero_optimization"]["stage"] == 2
    assert conf["fp16"]["enabled"] and conf["fp16"]["loss_scale"] == 0
    cfg3 = load_config(
        "configs/demo.yaml",
        ["deepspeed.zero_stage=3", "deepspeed.offload_params=true", "deepspeed.offload_optimizer=true"],
    )
    z = build_ds_config(cfg3, make_plan(cfg3, 2))["zero_optimization"]
    assert z["offload_param"]["device"] == "cpu" and z["offload_optimizer"]["device"] == "cpu"


def test_plan_report_memory_decreases_with_zero_stage():
    r = plan_report(load_config("configs/roberta-large.yaml"))
    mem = r["memory_per_rank"]
    assert 350e6 < r["params"] < 365e6  # RoBERTa-large: 355M
    assert (
        mem["zero0"]["device_gib"]
        > mem["zero1"]["device_gib"]
        > mem["zero2"]["device_gib"]
        > mem["zero3"]["device_gib"]
    )


def test_time_budget_config_errors_name_the_key():
    from runconfig import ConfigError

    with pytest.raises(ConfigError, match="schedule.budget_minutes: Input should be greater than 0"):
        load_config("configs/gpt2-budget.yaml", ["schedule.budget_minutes=0"])
    with pytest.raises(
        ConfigError, match=r"schedule.total_steps \(500\) conflicts with schedule.budget_minutes"
    ):
        load_config("configs/gpt2-budget.yaml", ["schedule.total_steps=500"])
    with pytest.raises(
        ConfigError, match=r"schedule.warmup_steps \(10\) conflicts with schedule.budget_minutes"
    ):
        load_config("configs/gpt2-budget.yaml", ["schedule.warmup_steps=10"])
    with pytest.raises(ConfigError, match="schedule.warmup_steps and schedule.warmup_fraction are both set"):
        load_config("configs/roberta-tiny.yaml", ["schedule.warmup_fraction=0.1"])
    # a step-counted preset becomes a time-budget run once its step keys are unset
    cfg = load_config(
        "configs/roberta-tiny.yaml",
        ["schedule.total_steps=null", "schedule.warmup_steps=null", "schedule.budget_minutes=2"],
    )
    plan = make_plan(cfg, 2)
    assert plan.total_steps is None and plan.budget_s == 120 and plan.warmup_fraction == 0.05
    assert plan_report(cfg, 2)["plan"]["total_tokens"] is None


def test_time_schedule_follows_the_clock():
    from pretrain.run.schedule import TimeWarmupDecay

    f = TimeWarmupDecay(budget_s=100.0, warmup_fraction=0.1, decay="linear", min_ratio=0.0)
    points = {}
    for t in (0.0, 5.0, 10.0, 55.0, 100.0, 130.0):
        f.elapsed_s = t
        points[t] = f(12345)  # the step argument is ignored: only the clock counts
    assert points[0.0] == pytest.approx(1e-3) and points[5.0] == pytest.approx(0.5)
    assert points[10.0] == pytest.approx(1.0) and points[55.0] == pytest.approx(0.5)
    assert points[100.0] == 0.0 and points[130.0] == 0.0
    cos = TimeWarmupDecay(100.0, 0.0, "cosine", 0.1)
    cos.elapsed_s = 50.0
    assert cos(0) == pytest.approx(0.55)


def test_step_counted_defaults_unchanged():
    cfg = load_config("configs/demo.yaml", ["schedule.budget_minutes=null"])
    assert cfg.schedule.steps == 1000 and cfg.schedule.warmup == 50  # warmup_fraction 0.05 of the preset
    cfg = load_config("configs/roberta-tiny.yaml")
    assert make_plan(cfg, 2).total_steps == 200 and make_plan(cfg, 2).warmup_steps == 20


@pytest.mark.timeout(30)
def test_train_plan_lines_show_a_time_budget_warmup():
    """Issue 43 friction 7: a time-budget run warms up over a fraction of its clock; the plan lines said
    "warmup 0" (the step count, unused by such a schedule)."""
    from pretrain.run import lr_scaling
    from pretrain.run.schedule import make_plan
    from runconfig import load_config

    root = Path(__file__).resolve().parents[2]
    for rule in ("none", "sqrt"):
        cfg = load_config(
            root / "configs" / "roberta-tiny.yaml",
            [
                "schedule.budget_minutes=16",
                "schedule.total_steps=null",
                "schedule.warmup_steps=null",
                "schedule.warmup_fraction=0.05",
                f"lr_scaling.rule={rule}",
                *(["lr_scaling.reference_batch_size=8"] if rule != "none" else []),
            ],
        )
        plan = make_plan(cfg, 1)
        lines, _ = lr_scaling.explain(cfg, plan.global_batch_size, plan.peak_lr, plan.warmup_steps)
        text = "\n".join([*lines, plan.describe()])
        assert "warmup 0" not in text and "= 0 steps" not in text, text
        assert "warmup 5% of the 16-minute budget" in text, text
