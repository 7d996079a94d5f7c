"""Adaptation methods as arms of finetune and transfer (frozen, lora, ulmfit), for every registered family at tiny
size on real BBC text, plus their parts: ULMFiT's groups, LRs and schedule, LoRA's target check, and a LoRA folder
reloaded in a fresh process with peft alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from adapt.methods import lora, ulmfit
from adapt.report import LAYERS_PLOT, LAYERS_TABLE
from adapt.transfer import prepare_task, run_transfer
from core.errors import ConfigError
from data_pipeline.labelled import load_tasks
from pretrain.families import family_names
from tests.adapt.test_finetune import _export, _labelled_folder, _labelled_rows, _task_cfg
from tests.pretrain.conftest import child_env

FAMILIES = family_names()
QUIET = {"log": lambda *_: None}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """One tiny export per family (its own tokenizer on the labelled text), made on first use."""
    made: dict[str, tuple] = {}
    rows = _labelled_rows(per_label=10, chars=400)

    def get(family: str):
        if family not in made:
            root = tmp_path_factory.mktemp(family)
            folder = _labelled_folder(root, rows)
            export, overrides = _export(root, f"{family}-tiny", [r[1] for r in rows])
            made[family] = (root, folder, export, overrides)
        return made[family]

    return get


def _cfg(family: str, overrides, folder, *more):
    return _task_cfg(f"{family}-tiny", [*overrides, "finetune.epochs=1", *more], train=str(folder))


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", FAMILIES)
def test_frozen_method_probes_every_layer_and_mixes_them(exports, family):
    root, folder, export, overrides = exports(family)
    cfg = _cfg(
        family,
        overrides,
        folder,
        "finetune.methods=[frozen]",
        "finetune.seeds=[0,1]",
        "finetune.frozen.mix_steps=50",
    )
    report = run_transfer(cfg, export, root / "frozen", **QUIET)
    r = report["tasks"]["t"]
    assert r["arms"] == {} and set(r["methods"]) == {"frozen"}
    n_layers = AutoConfig.from_pretrained(export).num_hidden_layers
    for arm, e in r["methods"]["frozen"]["arms"].items():
        assert [x["layer"] for x in e["layers"]] == list(range(n_layers + 1)), arm  # embeddings + each layer
        assert all(0.0 <= x["test"] <= 1.0 for x in e["layers"])
        assert abs(sum(e["mix_weights"]) - 1.0) < 1e-3 and len(e["mix_weights"]) == n_layers + 1
        assert len(e["test_accuracy"]["values"]) + len(e.get("collapsed", {})) == 2
    table = (root / "frozen" / LAYERS_TABLE).read_text()
    assert "| layer | pretrained | random |" in table and f"| {n_layers} |" in table
    assert (root / "frozen" / LAYERS_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", FAMILIES)
def test_lora_method_trains_adapters_on_the_family_targets(exports, family):
    root, folder, export, overrides = exports(family)
    cfg = _cfg(family, overrides, folder, "finetune.methods=[lora]", "finetune.probe=false")
    report = run_transfer(cfg, export, root / "lora", **QUIET)
    m = report["tasks"]["t"]["methods"]["lora"]
    assert set(m["arms"]) == {"pretrained", "random"}
    assert m["arms"]["pretrained"]["lr"] == pytest.approx(
        cfg.finetune.lr_grid[0] * cfg.finetune.lora.lr_scale
    )
    record = json.loads(
        (
            root
            / "lora"
            / "t"
            / "lora"
            / "pretrained"
            / f"lr{m['arms']['pretrained']['lr']:g}-seed0"
            / "result.json"
        ).read_text()
    )
    assert record["method"] == "lora"


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", FAMILIES)
def test_ulmfit_method_runs_with_its_schedule(exports, family):
    root, folder, export, overrides = exports(family)
    cfg = _cfg(
        family,
        overrides,
        folder,
        "finetune.methods=[full,ulmfit]",
        "finetune.probe=false",
        "finetune.ulmfit.unfreeze_every=2",
    )
    report = run_transfer(cfg, export, root / "ulmfit", **QUIET)
    r = report["tasks"]["t"]
    assert set(r["arms"]) == {"pretrained", "random"}  # full: today's figures stay where the card reads them
    assert set(r["methods"]["ulmfit"]["arms"]) == {"pretrained", "random"}


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_lora_folder_reloads_with_peft_alone_and_predicts_the_same(exports):
    """The saved adapters + head load with AutoPeftModelForSequenceClassification in a fresh process (no lmstack
    import) and predict exactly what the fine-tuned model predicted."""
    root, folder, export, overrides = exports("roberta")
    cfg = _cfg(
        "roberta",
        overrides,
        folder,
        "finetune.methods=[lora]",
        "finetune.seeds=[0]",
        "finetune.long_inputs=truncate",
    )
    data = load_tasks(cfg)[0]
    tok = AutoTokenizer.from_pretrained(export)
    task = prepare_task(cfg.finetune, data, tok, export)
    out = root / "lora-saved"
    task.fine_tune("pretrained", 1.0e-2, 0, out, save_model=True, method="lora")
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    expected = json.loads((out / "result.json").read_text())["predictions"]["test"]
    texts = [row[1] for row in data.test]
    script = textwrap.dedent(f"""
        import json, sys, torch
        from peft import AutoPeftModelForSequenceClassification
        from transformers import AutoTokenizer
        assert "adapt" not in sys.modules and "pretrain" not in sys.modules
        model = AutoPeftModelForSequenceClassification.from_pretrained({str(out)!r}, num_labels={len(data.labels)}).eval()
        tok = AutoTokenizer.from_pretrained({str(out)!r})
        texts = json.loads(sys.stdin.read())
        with torch.no_grad():
            enc = tok(texts, truncation=True, max_length={task.max_len}, padding=True, return_tensors="pt")
            print(json.dumps(model(**enc).logits.argmax(-1).tolist()))
    """)
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == expected


def _tiny_classifier(family: str = "roberta"):
    cfg = AutoConfig.for_model(
        family,
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
        pad_token_id=1,
    )
    return AutoModelForSequenceClassification.from_config(cfg)


def test_ulmfit_groups_run_from_embeddings_through_each_block_to_the_head():
    model = _tiny_classifier()
    groups = ulmfit.layer_groups(model)
    assert len(groups) == 3 + 2
    assert any("embeddings" in n for n in groups[0]) and all(".layer." not in n for n in groups[0])
    for i in range(3):
        assert groups[1 + i] and all(f"encoder.layer.{i}." in n for n in groups[1 + i])
    assert groups[-1] and all(n.startswith("classifier.") for n in groups[-1])
    assert sorted(n for g in groups for n in g) == sorted(n for n, _ in model.named_parameters())


def test_slanted_triangular_rises_to_the_peak_at_cut_and_falls_to_one_over_ratio():
    total, cut_frac, ratio = 1000, 0.1, 32
    f = [ulmfit.slanted_triangular(t, total, cut_frac, ratio) for t in range(total + 1)]
    assert f[0] == pytest.approx(1 / ratio) and f[100] == pytest.approx(1.0)
    assert f[total] == pytest.approx(1 / ratio)
    assert all(a < b for a, b in zip(f[:100], f[1:101], strict=True))  # rising
    assert all(a > b for a, b in zip(f[100:-1], f[101:], strict=True))  # falling, 9x slower


def test_ulmfit_trainer_gives_each_group_the_lr_above_divided_by_the_decay(tmp_path):
    from transformers import TrainingArguments

    model = _tiny_classifier()
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, report_to=[], use_cpu=True)
    trainer = ulmfit.UlmfitTrainer(model=model, args=args, ulmfit=ulmfit.UlmfitSettings())
    opt = trainer.create_optimizer()
    lrs = [g["lr"] for g in opt.param_groups]
    assert lrs[-1] == pytest.approx(1e-3) and len(lrs) == 5
    for lower, upper in zip(lrs, lrs[1:], strict=False):
        assert upper / lower == pytest.approx(2.6)


def test_gradual_unfreezing_opens_one_group_from_the_top_every_interval():
    model = _tiny_classifier()
    cb = ulmfit.GradualUnfreezing(every=3)
    cb.on_train_begin(None, None, None, model=model)
    params = dict(model.named_parameters())

    def trainable():
        return [all(params[n].requires_grad for n in g) for g in cb.groups]

    assert trainable() == [False, False, False, False, True]  # the head only
    cb.apply(3)
    assert trainable() == [False, False, False, True, True]
    cb.apply(12)
    assert trainable() == [True] * 5
    cb.apply(2)
    assert not any(params[n].requires_grad for g in cb.groups[:-1] for n in g)


def test_lora_target_modules_missing_from_the_model_are_named():
    model = _tiny_classifier()
    with pytest.raises(
        ConfigError, match=r"lora_target_modules of family 'roberta'.*\['q_proj'\] not in the model"
    ):
        lora.check_targets(model, ("query", "q_proj"), "roberta")
    lora.check_targets(model, ("query", "value"), "roberta")


def test_an_unknown_method_is_refused_at_load_naming_the_key():
    from runconfig import load_config

    with pytest.raises(ConfigError, match=r"finetune\.methods"):
        load_config("configs/roberta-tiny.yaml", ["finetune.methods=[adapters]"])
    with pytest.raises(ConfigError, match=r"finetune\.methods.*twice"):
        load_config("configs/roberta-tiny.yaml", ["finetune.methods=[lora,lora]"])


@pytest.mark.integration  # a LoRA fine-tune and a fresh process: ~15 s alone, more under load
@pytest.mark.timeout(420)
def test_a_lora_folder_names_its_labels_and_loads_as_its_card_says(tmp_path):
    """Issue 66: the LoRA folder had no label names (LABEL_0/1 where the full folder has id2label), a README that
    was peft's empty template with this machine's absolute path as `base_model`, and `score` twice in
    `modules_to_save`. Now: each module once; the README a model card (no local path in its metadata) whose loading
    snippet, run in a fresh process with transformers and peft alone, gives the named labels and the run's
    predictions."""
    from huggingface_hub import ModelCard

    rows = _labelled_rows(per_label=6, chars=200)
    folder = _labelled_folder(tmp_path, rows)
    export, overrides = _export(tmp_path, "gpt2-tiny", [r[1] for r in rows])
    cfg = _task_cfg(
        "gpt2-tiny",
        [*overrides, "finetune.methods=[lora]", "finetune.long_inputs=truncate"],
        train=str(folder),
    )
    data = load_tasks(cfg)[0]
    task = prepare_task(cfg.finetune, data, AutoTokenizer.from_pretrained(export), export)
    out = tmp_path / "lora-saved"
    task.fine_tune("pretrained", 1.0e-2, 0, out, save_model=True, method="lora")
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert sorted(adapter["modules_to_save"]) == sorted(set(adapter["modules_to_save"])), adapter[
        "modules_to_save"
    ]
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft" and "base_model" not in card.data.to_dict()
    assert str(tmp_path) not in card.content and "[More Information Needed]" not in card.content
    assert all(f"`{name}`" in card.content for name in data.labels)
    snippet = (
        card.content.split("```python\n", 1)[1].split("```", 1)[0].replace("path/to/this/folder", str(out))
    )
    script = snippet + textwrap.dedent(f"""
        import json, sys, torch
        assert "adapt" not in sys.modules and "pretrain" not in sys.modules
        texts = json.loads(sys.stdin.read())
        with torch.no_grad():
            preds = [int(model(**tokenizer(t, truncation=True, max_length={task.max_len}, return_tensors="pt")).logits.argmax())
                     for t in texts]
        print(json.dumps({{"labels": model.config.id2label, "predictions": preds}}))
    """)
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([r[1] for r in data.test]),
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["labels"] == {str(i): n for i, n in enumerate(data.labels)}
    assert got["predictions"] == json.loads((out / "result.json").read_text())["predictions"]["test"]
