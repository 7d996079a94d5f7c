"""ULMFiT's recipe end to end (issue 48 item 2): the export continued on the task's own training text, then
fine-tuned, reported beside the export without it. The text never holds a dev or test example (the transfer
stage's id-hash split)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from adapt.continued import continued_config, run_continue, task_text
from adapt.report import format_report
from core.registry import FAMILIES, OBJECTIVES
from data_pipeline.labelled import load_tasks
from runconfig import ConfigError, load_config
from runconfig.load import save_resolved
from tests.adapt.test_finetune import _export, _labelled_folder, _labelled_rows, _task_cfg
from tests.hf_folder import gpt2_folder


def test_task_text_is_the_training_split_only(tmp_path):
    rows = _labelled_rows(per_label=10, chars=300)
    folder = _labelled_folder(tmp_path, rows)
    cfg = _task_cfg("gpt2-tiny", [f"run.output_dir={tmp_path / 'run'}"], train=str(folder))
    (task,) = load_tasks(cfg)
    assert task.dev and task.test
    info = task_text([task], tmp_path / "text.jsonl")
    docs = [json.loads(x) for x in (tmp_path / "text.jsonl").read_text().splitlines()]
    used = {d["id"].split("/", 1)[1] for d in docs}
    assert used == {r[0] for r in task.train} and len(docs) == info["documents"] == len(task.train)
    assert not used & {r[0] for r in task.dev + task.test}  # no dev/test example is read while continuing
    leaky = dataclasses.replace(task, dev=task.dev + task.train[:1])
    with pytest.raises(ValueError, match="training ids are also dev/test ids"):
        task_text([leaky], tmp_path / "leak.jsonl")
    run = continued_config(cfg, gpt2_folder(tmp_path / "export", positions=128), tmp_path / "text.jsonl", 5)
    assert [s.name for s in run.data.sources] == ["task-train-text"] and run.finetune.tasks == []
    assert run.schedule.total_steps == 5 and run.run.output_dir == str(tmp_path / "run" / "continued")


def test_a_time_budget_recipe_continues_for_a_number_of_steps(tmp_path):
    """bench/adaptation.py found it: a *-budget recipe sets schedule.warmup_fraction, and the continued run's
    warmup_steps beside it was refused at load ('both set'), so ULMFiT's arm never ran for the budget recipes."""
    cfg = _task_cfg("gpt2-budget", [f"run.output_dir={tmp_path / 'run'}"], train=str(tmp_path))
    assert cfg.schedule.warmup_fraction is not None and cfg.schedule.budget_minutes is not None
    export = gpt2_folder(tmp_path / "export", positions=128)
    run = continued_config(cfg, export, tmp_path / "text.jsonl", 40)
    assert run.schedule.total_steps == 40 and run.schedule.budget_minutes is None
    assert run.schedule.warmup_fraction is None and run.schedule.warmup_steps == 4


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_continued_run_is_valid_for_every_family(tmp_path, family):
    """Issue 64 item 7: `continued_config` kept only model.family and model.size, so model.dropout fell back to
    its default 0.1, which the Llama family refuses ('has no residual or embedding dropout'): `adapt continue`
    refused every Llama recipe at load. The continued run keeps the run's model settings (the export's folder
    decides the architecture), and the config it writes loads again as the subprocess stages load it."""
    preset = f"{family}-tiny"
    rows = _labelled_rows(per_label=4, chars=200)
    export, overrides = _export(tmp_path, preset, [r[1] for r in rows])
    cfg = _task_cfg(preset, overrides, train=str(tmp_path))
    if all(OBJECTIVES.get(o).needs_encoder for o in FAMILIES.get(family).objectives):  # RTD: a generator too
        with pytest.raises(
            ConfigError, match=rf"model.family '{family}' trains with no other objective, so its"
        ):
            continued_config(cfg, export, tmp_path / "text.jsonl", 10)
        with pytest.raises(ConfigError, match=r"its folders cannot be continued"):  # before any fine-tune
            run_continue(cfg, export, tmp_path / "out", steps=10)
        assert not (tmp_path / "out").exists() and not (export / "transfer.json").exists()
        return
    run = continued_config(cfg, export, tmp_path / "text.jsonl", 10)
    assert run.model.family == family and run.model.init_from == str(export)
    kept = {k: v for k, v in cfg.model.model_dump().items() if k in ("dropout", "attention_dropout", "size")}
    assert {k: getattr(run.model, k) for k in kept} == kept
    reloaded = load_config(save_resolved(run, tmp_path / "continued", "continue.yaml"))
    assert reloaded.model.init_from == str(export) and reloaded.schedule.total_steps == 10


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_continued_arm_runs_and_is_reported_beside_the_export(tmp_path):
    rows = _labelled_rows(per_label=10, chars=400)
    folder = _labelled_folder(tmp_path, rows)
    export, overrides = _export(tmp_path, "gpt2-tiny", [r[1] for r in rows])
    more = [
        "finetune.epochs=3",
        "finetune.seeds=[0]",
        "finetune.lr_grid=[1.0e-3]",
        "finetune.probe=false",
        "batch.global_batch_size=8",
        "batch.micro_batch_size=4",
        "loader.num_workers=0",
    ]
    cfg = _task_cfg("gpt2-tiny", [*overrides, *more], train=str(folder))
    report = run_continue(cfg, export, tmp_path / "out", steps=2)
    c = report["tasks"]["t"]["continued"]
    cont = tmp_path / "run-gpt2-tiny" / "continued" / "export"
    # a fine-tune this short may still predict one class: the arm is then reported as collapsed, and a margin over
    # the export without it exists only when both that arm and the export's own pretrained arm kept a run (CI saw
    # the export's arm collapse while the continued one did not: no margin, rightly)
    kept = bool(c["arm"]["test_accuracy"]["values"])
    assert c["export"] == str(cont) and (kept or c["arm"]["collapsed"]), c["arm"]
    without = report["tasks"]["t"]["arms"]["pretrained"]["test_accuracy"]["values"]
    compared = kept and bool(without)
    assert ("margin" in c) == compared and set(report["tasks"]["t"]["arms"]) == {"pretrained", "random"}
    state = json.loads((cont / "training_state.json").read_text())
    assert state["step"] == 2 and state["init_from"]["path"] == str(export)
    (task,) = load_tasks(cfg)
    text = json.loads((cont / "task_text.json").read_text())
    used = {json.loads(x)["id"].split("/", 1)[1] for x in open(text["file"])}
    assert used and not used & {r[0] for r in task.dev + task.test}
    text = format_report(report)
    assert "  continued " in text and ("over the export without it" in text) == compared
    assert json.loads((tmp_path / "out" / "transfer.json").read_text())["tasks"]["t"]["continued"]["export"]


def test_the_baseline_is_reused_only_under_the_same_protocol(tmp_path):
    """Issue 64 item 6: `adapt continue` reused the export's transfer.json whenever the weights hash matched, and
    set the continued arm (one seed, the current finetune.*) against that baseline (three seeds, other steps):
    a margin and p-value across two protocols, unmarked. transfer.json now records its protocol; the baseline
    is reused only when the settings that decide the pretrained arm's result match, otherwise rerun under the
    current protocol (the export's own transfer.json left as it was) and the report names the keys."""
    from adapt.continued import transfer_baseline
    from adapt.report import RESULT_FILE
    from adapt.transfer import run_transfer

    rows = _labelled_rows(per_label=8, chars=200)
    folder = _labelled_folder(tmp_path, rows)
    export, overrides = _export(tmp_path, "gpt2-tiny", [r[1] for r in rows])
    quick = [*overrides, "finetune.epochs=1", "finetune.probe=false", "finetune.methods=[full]"]
    cfg = _task_cfg("gpt2-tiny", quick, train=str(folder))
    published = run_transfer(cfg, export, tmp_path / "tr", log=lambda *_: None)
    assert published["protocol"]["seeds"] == [0] and "threads" not in published["protocol"]
    written = (export / RESULT_FILE).read_bytes()

    # the same protocol (how many workers or threads ran it does not change it): reused as it is
    same = _task_cfg("gpt2-tiny", [*quick, "finetune.threads=2", "finetune.probe=true"], train=str(folder))
    base = transfer_baseline(same, export, tmp_path / "out")
    assert base["baseline"] == {"source": str(export / RESULT_FILE)}
    assert base["tasks"]["t"] == json.loads(written)["tasks"]["t"]

    # another protocol (two seeds): the baseline arm is rerun with it; the export's transfer.json is untouched
    other = _task_cfg("gpt2-tiny", [*quick, "finetune.seeds=[0,1]"], train=str(folder))
    base = transfer_baseline(other, export, tmp_path / "out")
    assert base["baseline"]["source"] == "rerun" and base["baseline"]["differs"] == ["finetune.seeds"]
    arm = base["tasks"]["t"]["arms"]["pretrained"]
    assert len(arm["test_accuracy"]["values"]) + len(arm.get("collapsed", {})) == 2
    assert base["protocol"]["seeds"] == [0, 1] and set(base["tasks"]["t"]["arms"]) == {"pretrained"}
    assert (export / RESULT_FILE).read_bytes() == written

    # a transfer.json from before protocols were recorded: its protocol is unknown, so the baseline is rerun
    old = json.loads(written)
    del old["protocol"]
    (export / RESULT_FILE).write_text(json.dumps(old))
    base = transfer_baseline(cfg, export, tmp_path / "out")
    assert base["baseline"] == {"source": "rerun", "differs": ["protocol (not recorded in transfer.json)"]}
    text = format_report({**base, "tasks": {}})
    assert "baseline rerun under this protocol" in text and "not recorded" in text
