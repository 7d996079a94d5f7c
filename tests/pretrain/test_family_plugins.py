"""Families and objectives from outside the package: a toy package on sys.path exposes a BERT family and an MLM
variant through real `lmstack.families` / `lmstack.objectives` entry points (a *.dist-info folder, as pip writes
it), and the registry, config validation and the real training loop pick them up without an edit here."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.pretrain.conftest import ROOT, child_env

TOY_PACKAGE = '''
"""An outside package adding a family and an objective to lmstack."""
from core.specs import FamilySpec, ObjectiveSpec
from data_pipeline.objectives.builtin import mlm_collator


def build_config(m, tokenizer, seq_len, vocab_size):
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
    res = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=plugin_env(plug), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"gpt2", "roberta", "t5", "toybert"} <= set(out["families"]) and out["families"] == sorted(out["families"])
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
    overrides = [f"run.output_dir={out}", "model.family=toybert", "objective.type=toy_mlm",
                 "schedule.total_steps=4", "model.max_position_embeddings=64"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def run(args: list[str]) -> subprocess.CompletedProcess:
        res = subprocess.run([sys.executable, *args, "--config", str(roberta_run), *overrides], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
        return res

    run(["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), "-m", "pretrain", "train"])
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert losses and all(0 < v < 20 for v in losses)
    run(["-m", "pretrain", "export"])
    config = json.loads((out / "export" / "config.json").read_text())
    state = json.loads((out / "export" / "training_state.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and state["step"] == 4
    assert state["parity_max_abs_diff"] is not None and state["parity_max_abs_diff"] <= 1e-5
