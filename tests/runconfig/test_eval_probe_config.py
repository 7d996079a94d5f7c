"""eval.probe_task (issue 44 item 1) is refused at load, naming the key, where it cannot run: a task that is not
defined in finetune.tasks, ZeRO-3 (no rank holds the whole weights), a time bound the waiting ranks would not
survive."""

from __future__ import annotations

from pathlib import Path

import pytest

from runconfig import ConfigError, load_config

DEMO = str(Path(__file__).resolve().parents[2] / "configs/demo.yaml")


def test_the_demo_task_is_accepted():
    cfg = load_config(DEMO, ["eval.probe_task=bbc"])
    assert cfg.eval.probe_task == "bbc"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["eval.probe_task=sst2"],
            r"eval.probe_task: 'sst2' is not a task of finetune.tasks \(defined: \['bbc'\]\)",
        ),
        (
            ["eval.probe_task=bbc", "finetune.tasks=[]"],
            r"eval.probe_task: 'bbc' is not a task of finetune.tasks",
        ),
        (["eval.probe_task=bbc", "deepspeed.zero_stage=3"], r"eval.probe_task: .*deepspeed.zero_stage 3"),
        (
            ["eval.probe_task=bbc", "eval.probe_max_seconds=600"],
            r"eval.probe_max_seconds \(600\) must be below deepspeed.comm_timeout_s \(600\)",
        ),
        (
            ["eval.probe_max_examples=80"],
            r"eval.probe_max_examples was removed \(80 given\): .*eval.probe_max_seconds",
        ),
        (
            ["watchdog.straggler_min_excess_s=0"],
            r"watchdog.straggler_min_excess_s was removed \(0 given\): .*straggler_factor",
        ),
        (["eval.probe_max_seconds=0"], r"eval.probe_max_seconds"),
    ],
)
def test_refused_at_load_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(DEMO, overrides)


STS = "[{name: bbc, source: bbc}, {name: sts, train: sts.csv, label_column: score, problem: regression}]"


def test_a_regression_probe_task_is_refused_at_load_naming_the_key():
    """Issue 66: `eval.probe_task` on a regression task passed load, then every rank crashed at set-up with
    `KeyError: '0.556'` (the probe maps labels to classes)."""
    with pytest.raises(
        ConfigError, match=r"eval.probe_task: 'sts' is a regression task \(finetune.tasks.1.problem"
    ):
        load_config(DEMO, [f"finetune.tasks={STS}", "eval.probe_task=sts"])
    assert load_config(DEMO, [f"finetune.tasks={STS}", "eval.probe_task=bbc"]).eval.probe_task == "bbc"


def test_a_regression_task_on_a_text_to_text_family_is_refused_at_load_naming_task_and_family():
    """Issue 66: a T5 run with a regression task passed load, `plan` and the pipeline's preflight, and was refused
    only by `adapt transfer` after pretraining."""
    t5 = str(Path(DEMO).parent / "t5-tiny.yaml")
    tasks = "[{name: sts, train: sts.csv, label_column: score, problem: regression}]"
    with pytest.raises(ConfigError, match=r"finetune.tasks.0.problem: .*'sts'.*model.family 't5'"):
        load_config(t5, [f"finetune.tasks={tasks}"])
    load_config(t5, [f"finetune.tasks={tasks.replace('regression', 'classification')}"])
