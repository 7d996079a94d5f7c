"""Issue 66 items 5 and 6: what `adapt transfer` publishes. The card beside the export is rewritten from the new
transfer.json (model-index and body), or the command says `pretrain card` is needed; a regression task's figures
are named as the metric adapt computes (Pearson's r), never "accuracy", in the card body, TensorBoard, the probe
plot and the CLI help; and every adaptation method's results reach TensorBoard and the card body."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import metadata_load
from transformers import RobertaConfig, RobertaForMaskedLM

from adapt.report import layer_figure, to_tensorboard
from adapt.transfer import publish_transfer
from pretrain.export.folder import TRAINING_STATE, weights_hash
from pretrain.export.model_card import write_model_card
from runconfig import load_config
from tests.pretrain.test_model_card_methods import _task

ROOT = Path(__file__).resolve().parents[2]


def _run_export(tmp_path: Path, into: Path | None = None, config: str = "roberta-tiny.yaml"):
    """A tiny real export (weights, config, training state) with its first card, as `pretrain export` leaves it."""
    cfg = load_config(ROOT / "configs" / config, [f"run.output_dir={tmp_path}/run"])
    from core.run_layout import RunLayout

    export = into or RunLayout(cfg).export
    model = RobertaForMaskedLM(
        RobertaConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=40,
        )
    )
    model.save_pretrained(export)
    (export / TRAINING_STATE).write_text(json.dumps({"step": 100, "tokens_seen": 4096, "n_params": 1234}))
    write_model_card(cfg, export)
    return cfg, export


def _report(export: Path) -> dict:
    return {
        "model": str(export),
        "weights_sha256": weights_hash(export),
        "tasks": {"topics": _task("topics", "accuracy", 0.8), "sts": _task("sts", "pearsonr", 0.6)},
    }


def _scalars(folder: Path) -> dict[str, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, float] = {}
    for events in folder.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        out |= {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}
    return out


def test_transfer_rewrites_the_card_beside_the_export(tmp_path, capfd):
    """`adapt transfer` rewrote transfer.json beside the export but left README.md's model-index as it was."""
    cfg, export = _run_export(tmp_path)
    assert "not run yet" in (export / "README.md").read_text()
    capfd.readouterr()
    publish_transfer(cfg, _report(export), tmp_path / "ft", export)
    said = capfd.readouterr().out
    text = (export / "README.md").read_text()
    assert "not run yet" not in text and "| sts |" in text
    results = metadata_load(export / "README.md")["model-index"][0]["results"]
    assert {r["dataset"]["name"] for r in results} == {"topics", "sts"}
    assert f"{export / 'README.md'}: model card rewritten" in said


def test_a_folder_other_than_the_runs_export_is_told_pretrain_card_is_needed(tmp_path, capfd):
    """--model of a folder that is not this run's export: its card is not rewritten from this run's files; the
    command says which command rewrites it."""
    other = tmp_path / "elsewhere"
    cfg, export = _run_export(tmp_path, into=other)
    before = (export / "README.md").read_text()
    capfd.readouterr()
    publish_transfer(cfg, _report(export), tmp_path / "ft", export)
    said = capfd.readouterr().out
    assert (export / "README.md").read_text() == before and (export / "transfer.json").is_file()
    assert "python -m pretrain card" in said and f"--model {export}" in said


def test_the_card_body_names_each_tasks_metric_and_lists_every_method(tmp_path):
    cfg, export = _run_export(tmp_path)
    publish_transfer(cfg, _report(export), tmp_path / "ft", export)
    body = (export / "README.md").read_text().split("\n---\n", 1)[1]
    rows = [line for line in body.splitlines() if line.startswith("| sts |")]
    assert rows and all("Pearson r" in r for r in rows), rows
    assert {m for m in ("fine-tuned", "LoRA", "ULMFiT", "frozen") if any(m in r for r in rows)} == {
        "fine-tuned",
        "LoRA",
        "ULMFiT",
        "frozen",
    }
    # a regression margin is a difference of r, not "points"
    (full,) = [r for r in rows if "fine-tuned" in r]
    assert "+0.489" in full and "points" not in full
    topics = [line for line in body.splitlines() if line.startswith("| topics |")]
    assert len(topics) == 4 and all("accuracy" in r for r in topics)
    assert "+68.9 points" in topics[0]


def test_tensorboard_names_the_metric_and_carries_every_method(tmp_path):
    tasks = [_task("topics", "accuracy", 0.8), _task("sts", "pearsonr", 0.6)]
    to_tensorboard(tmp_path, tasks)
    tags = _scalars(tmp_path)
    assert (
        "transfer/sts/pretrained/test_pearsonr" in tags and "transfer/sts/pretrained/test_spearmanr" in tags
    )
    assert not [t for t in tags if t.startswith("transfer/sts/") and "accuracy" in t], sorted(tags)
    assert tags["transfer/topics/pretrained/test_accuracy"] == pytest.approx(0.8)
    for method, delta in (("lora", -0.02), ("ulmfit", 0.01), ("frozen", -0.2)):
        assert tags[f"transfer/topics/{method}/pretrained/test_accuracy"] == pytest.approx(0.8 + delta)
        assert tags[f"transfer/sts/{method}/pretrained/test_pearsonr"] == pytest.approx(0.6 + delta)


def test_the_probe_plot_axis_names_a_regression_tasks_metric():
    layers = [{"layer": i, "dev": 0.1 * i, "test": 0.1 * i} for i in range(3)]

    def task(metric: str) -> dict:
        return {"metric": metric, "methods": {"frozen": {"arms": {"pretrained": {"layers": layers}}}}}

    fig = layer_figure({"tasks": {"topics": task("accuracy"), "sts": task("pearsonr")}})
    labels = {ax.get_title(): ax.get_ylabel() for ax in fig.axes}
    assert labels == {"topics": "probe test accuracy", "sts": "probe test Pearson r"}


def test_finetune_help_does_not_call_every_figure_accuracy(capsys):
    from adapt.__main__ import main

    for argv in (["--help"], ["finetune", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "Pearson" in out, out


def test_a_plain_hf_folder_is_told_there_is_no_card_to_rewrite(tmp_path, capfd):
    cfg, export = _run_export(tmp_path)
    (export / TRAINING_STATE).unlink()
    (export / "README.md").unlink()
    capfd.readouterr()
    publish_transfer(cfg, _report(export), tmp_path / "ft", export)
    assert f"{export}: no {TRAINING_STATE}" in capfd.readouterr().out
    assert not (export / "README.md").exists() and (export / "transfer.json").is_file()
