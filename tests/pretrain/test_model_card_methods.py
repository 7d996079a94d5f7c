"""The card's model-index carries one result per task and adaptation method (issue 48 item 6): full, frozen, lora
and ulmfit, each with its task's metric type (accuracy, or pearsonr and spearmanr for a regression task), read
back by huggingface_hub's own parsers (ModelCard and metadata_load)."""

from __future__ import annotations

from huggingface_hub import ModelCard, metadata_load

from tests.pretrain.test_model_card_hub import card


def _arm(mean: float, spearman: float | None = None) -> dict:
    e = {"lr": 1e-3, "test_accuracy": {"mean": mean, "sd": 0.01, "values": [mean - 0.01, mean, mean + 0.01]}}
    if spearman is not None:
        e["test_spearman"] = {"mean": spearman, "sd": 0.01, "values": [spearman] * 3}
    return e


def _task(name: str, metric: str, base: float) -> dict:
    reg = metric == "pearsonr"
    methods = {"frozen": base - 0.2, "lora": base - 0.02, "ulmfit": base + 0.01}
    return {
        "task": name,
        "metric": metric,
        "splits": {"train": 100, "dev": 20, "test": 50},
        "arms": {
            "pretrained": {**_arm(base, base - 0.05 if reg else None), "probe_accuracy": base - 0.3},
            "random": _arm(0.111),
        },
        "methods": {
            m: {"arms": {"pretrained": _arm(v, v - 0.05 if reg else None), "random": _arm(0.111)}}
            for m, v in methods.items()
        },
        "margin": base - 0.111,
    }


def test_one_model_index_result_per_task_and_method_with_its_metric_type(tmp_path):
    tr = {
        "model": "x",
        "tasks": {"topics": _task("topics", "accuracy", 0.8), "sts": _task("sts", "pearsonr", 0.6)},
    }
    text = card(tmp_path, "roberta", tr=tr)
    path = tmp_path / "README.md"
    path.write_text(text)
    meta = metadata_load(path)
    (entry,) = meta["model-index"]
    by_task = {r["dataset"]["name"]: r["metrics"] for r in entry["results"] if r["dataset"]["name"] != "bbc"}
    assert set(by_task) >= {"topics", "sts"}
    for name, metrics in by_task.items():
        if name not in ("topics", "sts"):
            continue
        fine_tuned = {(m["config"], m["type"]): m["value"] for m in metrics if m["config"] != "probe"}
        kinds = {"topics": ["accuracy"], "sts": ["pearsonr", "spearmanr"]}[name]
        assert set(fine_tuned) == {(meth, k) for meth in ("full", "frozen", "lora", "ulmfit") for k in kinds}
        base = 0.8 if name == "topics" else 0.6
        assert fine_tuned[("lora", kinds[0])] == round(base - 0.02, 4)
        assert fine_tuned[("ulmfit", kinds[0])] == round(base + 0.01, 4)
        (probe,) = [m for m in metrics if m["config"] == "probe"]
        assert probe["type"] == kinds[0] and probe["value"] == round(base - 0.3, 4)
    # the random-init arm is a baseline, never one of this model's results
    results = ModelCard(text).data.eval_results
    assert all(r.metric_value != 0.111 for r in results)
    names = {(r.dataset_name, r.metric_config, r.metric_type): r.metric_name for r in results}
    assert (
        "LoRA" in names[("topics", "lora", "accuracy")] and "Pearson r" in names[("sts", "full", "pearsonr")]
    )
    assert (
        "Spearman" in names[("sts", "ulmfit", "spearmanr")]
        and "ULMFiT" in names[("sts", "ulmfit", "spearmanr")]
    )
    assert {r.task_name for r in results if r.dataset_name == "sts"} == {"Text regression"}


def test_a_method_whose_every_seed_collapsed_has_no_result(tmp_path):
    t = _task("topics", "accuracy", 0.8)
    t["methods"]["lora"]["arms"]["pretrained"]["test_accuracy"] = {"mean": None, "sd": None, "values": []}
    results = ModelCard(
        card(tmp_path, "roberta", tr={"model": "x", "tasks": {"topics": t}})
    ).data.eval_results
    assert {r.metric_config for r in results if r.dataset_name == "topics"} == {
        "full",
        "frozen",
        "ulmfit",
        "probe",
    }
