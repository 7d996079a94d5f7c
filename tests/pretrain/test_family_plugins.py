"""Families and objectives from outside the package: a toy package on sys.path exposes a BERT family and an MLM
variant through real `lmstack.families` / `lmstack.objectives` entry points (a *.dist-info folder, as pip writes
it), and the registry, config validation and the real training loop pick them up without an edit here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.pretrain.conftest import ROOT, child_env, train_command

TOY_PACKAGE = '''
"""An outside package adding a family and an objective to lmstack."""
from core.specs import FamilySpec, ObjectiveSpec
from data_pipeline.objectives.builtin import mlm_collator


def build_config(m, tokenizer, vocab_size):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                      num_attention_heads=m.num_heads, intermediate_size=m.ffn_size,
                      max_position_embeddings=m.max_position_embeddings, hidden_dropout_prob=m.dropout,
                      attention_probs_dropout_prob=m.attention_dropout, type_vocab_size=1,
                      pad_token_id=tokenizer.pad_token_id)


FAMILY = FamilySpec(name="toybert", build_config=build_config, model_class="BertForMaskedLM", task="masked_lm",
                    objectives=("mlm",), tokenizer_types=("bpe", "wordpiece"), auto_class="AutoModelForMaskedLM")


def objective():
    """Entry points may name a factory; this objective trains any masked-LM family without editing it."""
    return ObjectiveSpec("toy_mlm", ("full_sentences",), mlm_collator, trains=lambda fam: fam.task == "masked_lm")
'''


def install_toy_plugin(root: Path) -> Path:
    """What `pip install --target root toyplug` would leave: the module and its dist-info with entry points."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "toyplug.py").write_text(TOY_PACKAGE)
    info = root / "toyplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[lmstack.families]\ntoybert = toyplug:FAMILY\n\n[lmstack.objectives]\ntoy_mlm = toyplug:objective\n"
    )
    return root


def plugin_env(plugin_dir: Path) -> dict[str, str]:
    return child_env() | {"PYTHONPATH": f"{ROOT}{os.pathsep}{plugin_dir}"}


CHECK = textwrap.dedent("""
    import json, sys
    from pretrain.families import family_names
    from data_pipeline.objectives import objective_names
    from runconfig import ConfigError, load_config
    cfg = load_config("configs/roberta-tiny.yaml", ["model.family=toybert", "objective.type=toy_mlm"])
    try:
        load_config("configs/roberta-tiny.yaml", ["model.family=nosuch"])
    except ConfigError as e:
        unknown = str(e)
    try:
        load_config("configs/gpt2-tiny.yaml", ["objective.type=toy_mlm"])
    except ConfigError as e:
        refused = str(e)
    print(json.dumps({"families": family_names(), "objectives": objective_names(), "family": cfg.model.family,
                      "unknown": unknown, "refused": refused, "torch": "torch" in sys.modules}))
""")


def test_entry_points_register_family_and_objective(tmp_path):
    plug = install_toy_plugin(tmp_path / "site")
    res = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=ROOT,
        env=plugin_env(plug),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"gpt2", "roberta", "t5", "toybert"} <= set(out["families"]) and out["families"] == sorted(
        out["families"]
    )
    assert "toy_mlm" in out["objectives"] and out["family"] == "toybert"
    assert f"model.family: unknown family 'nosuch' (registered: {out['families']})" in out["unknown"]
    assert "objective.type: 'toy_mlm' cannot train model.family 'gpt2'" in out["refused"]
    assert out["torch"] is False  # the registry and config validation import no torch


@pytest.mark.integration
@pytest.mark.timeout(420)
@pytest.mark.deepspeed
def test_plugin_family_trains_through_the_real_loop_and_exports(roberta_run, tmp_path):
    """The toy BERT family and objective train 4 steps with DeepSpeed ZeRO-2 on 2 ranks, checkpoint and export
    with parity, on the RoBERTa run's byte-level BPE tokens."""
    plug = install_toy_plugin(tmp_path / "site")
    env = plugin_env(plug)
    out = tmp_path / "run"
    out.mkdir()
    for name in ("clean", "dedup", "tokenizer", "tokens"):
        (out / name).symlink_to((roberta_run.parent / "run" / name).resolve())
    overrides = [
        f"run.output_dir={out}",
        "model.family=toybert",
        "objective.type=toy_mlm",
        "schedule.total_steps=4",
        "model.max_position_embeddings=64",
    ]

    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        res = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
        return res

    run(train_command(roberta_run, overrides))
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert losses and all(0 < v < 20 for v in losses)
    run([sys.executable, "-m", "pretrain", "export", "--config", str(roberta_run), *overrides])
    config = json.loads((out / "export" / "config.json").read_text())
    state = json.loads((out / "export" / "training_state.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and state["step"] == 4
    assert state["parity_max_abs_diff"] is not None and state["parity_max_abs_diff"] <= 1e-5


REF_CHECK = textwrap.dedent("""
    import json
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from data_pipeline.objectives import build_collator
    from data_pipeline.tokenizers import save_tokenizer
    from data_pipeline.tokenizers.trainers import _train_bpe
    from pretrain.run.models import build_model
    from runconfig import load_config

    cfg = load_config("configs/roberta-tiny.yaml", ["model.family=toyref:FAMILY", "objective.type=toyref:objective",
                                                    "tokenizer.vocab_size=400", "tokenizer.min_frequency=1"])
    texts = ["The committee met on Tuesday and agreed the budget for the coming year."] * 20 + [
        "Sales of the new console rose in the autumn, the company said, and shares rose with them."] * 20
    save_tokenizer(_train_bpe(cfg, iter(texts)), "roberta", "tok", 64)
    tok = AutoTokenizer.from_pretrained("tok")
    model = build_model(cfg.model, tok, 32)
    collate = build_collator(cfg, tok)
    stream = [i for t in texts for i in tok(t)["input_ids"]]
    batch = collate([{"input_ids": np.array(stream[k * 32:(k + 1) * 32]), "sample_id": k, "epoch": 0}
                     for k in range(4)])
    torch.manual_seed(0)
    out = model(**batch)
    out.loss.backward()
    grad = sum(float(p.grad.norm()) for p in model.parameters() if p.grad is not None)
    print(json.dumps({"model": type(model).__name__, "loss": float(out.loss), "grad": grad,
                      "masked": int((batch["labels"] != -100).sum()), "family": cfg.model.family}))
""")


@pytest.mark.timeout(180)
def test_one_file_family_and_objective_by_reference_train_a_step(tmp_path):
    """No packaging: the same family and objective as one file on PYTHONPATH, named `module:Name` in the config;
    its collator and model run a forward and backward pass on tokens of a real tokenizer."""
    plug = tmp_path / "proj"
    plug.mkdir()
    (plug / "toyref.py").write_text(TOY_PACKAGE)
    res = subprocess.run(
        [sys.executable, "-c", REF_CHECK.replace('"tok"', repr(str(tmp_path / "tok")))],
        cwd=ROOT,
        env=plugin_env(plug),
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["model"] == "BertForMaskedLM" and out["family"] == "toyref:FAMILY"
    assert out["masked"] > 0 and 0 < out["loss"] < 20 and out["grad"] > 0
