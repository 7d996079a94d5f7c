"""Replaced-token detection through the real DeepSpeed engine on 2 CPU ranks, for every family that declares it
(`FamilySpec.rtd`; issue 46): it trains, a run resumed from a mid-run checkpoint ends with the same weights and
loss trace, bit for bit, as the uninterrupted run, the export reloads with logits parity <= 1e-5, and the exported
discriminator fine-tunes through the Hugging Face `Trainer` in a fresh process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrain.checkpoint import complete_tags
from pretrain.export.convert import consolidated_state_dict
from pretrain.families import family_names, get_family
from tests.pretrain.conftest import ROOT, child_env, run_module, torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(1200)]

RTD_FAMILIES = [n for n in family_names() if get_family(n).rtd is not None]
# ELECTRA's masking on any family (ModernBERT's own default is 30%).
RTD = [
    "objective.type=electra",
    "objective.mlm_probability=0.15",
    "objective.mask_token_fraction=0.85",
    "objective.random_token_fraction=0.0",
    "schedule.total_steps=8",
    "checkpoint.every_steps=4",
    "checkpoint.keep_last=2",
    "logging.every_steps=1",
]
# ModernBERT's run adds COCO-LM's sequence-contrastive loss (its budget recipe trains with it): the cropped view's
# draw (`crop_u`) must resume exactly as the generator's samples do. ELECTRA's run keeps plain RTD.
EXTRA = {"modernbert": ["objective.options.contrastive_weight=1.0"]}

FINETUNE = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments
path, out = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
texts = ["shares rose sharply on tuesday", "the team won the final match", "profits fell in the quarter",
         "the striker scored twice", "markets closed higher", "the coach praised the players"] * 4
labels = [0, 1] * 12
enc = tok(texts, padding="max_length", truncation=True, max_length=32)
enc.pop("token_type_ids", None)
rows = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": labels[i]}
        for i in range(len(texts))]
model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
before = {n: p.detach().clone() for n, p in model.base_model.named_parameters()}
args = TrainingArguments(out, max_steps=6, per_device_train_batch_size=8, learning_rate=1e-3, use_cpu=True,
                         report_to=[], save_strategy="no", logging_steps=1, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=rows)
result = trainer.train()
moved = sum(int(not torch.equal(before[n], p.detach())) for n, p in model.base_model.named_parameters())
print(json.dumps({"class": type(model).__name__, "body": type(model.base_model).__name__,
                  "loss": result.training_loss, "body_tensors_moved": moved, "body_tensors": len(before)}))
"""


def _rows(run_dir: Path) -> dict[tuple[str, int], dict]:
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {(r["split"], r["step"]): r for r in rows}


@pytest.mark.parametrize("family", RTD_FAMILIES)
def test_rtd_trains_resumes_exactly_exports_with_parity_and_fine_tunes(family, request, tmp_path):
    run_config = request.getfixturevalue(f"{family}_run")
    overrides = [*RTD, *EXTRA.get(family, [])]
    keys = ["loss", "lr", "grad_norm", "generator_loss", "discriminator_loss"]
    keys += ["contrastive_loss"] if family in EXTRA else []
    ref_dir, resumed_dir = tmp_path / "ref", tmp_path / "resumed"
    ref_dir.mkdir()
    resumed_dir.mkdir()

    # The uninterrupted run: 8 steps, checkpoints at 4 and 8.
    ref_out = isolated(run_config, ref_dir)
    torchrun(run_config, [ref_out, *overrides], timeout=600)
    ref_run = ref_dir / "run"
    assert complete_tags(ref_run / "checkpoints") == ["step00000004", "step00000008"]
    ref_rows = _rows(ref_run)
    train = [r for (split, _), r in sorted(ref_rows.items()) if split == "train"]
    assert len(train) == 8 and all(0 < r["loss"] < 100 for r in train), train
    last = train[-1]  # the objective's own figures: MLM + 50 x BCE, replaced fraction <= 15% masking
    objective = last["generator_loss"] + 50 * last["discriminator_loss"] + last.get("contrastive_loss", 0.0)
    assert abs(objective - last["loss"]) < 1e-3 * last["loss"], last
    assert ("contrastive_loss" in last) == (family in EXTRA), last
    assert 0 < last["replaced_fraction"] < 0.17, last

    # A second run that starts from the first one's step-4 checkpoint only (as after a crash there).
    out = isolated(run_config, resumed_dir)
    run_dir = resumed_dir / "run"
    shutil.copytree(ref_run / "checkpoints", run_dir / "checkpoints", symlinks=True)
    shutil.rmtree(run_dir / "checkpoints" / "step00000008")
    (run_dir / "checkpoints" / "latest").write_text("step00000004")
    res = torchrun(run_config, [out, *overrides], timeout=600)
    assert "resumed from" in res.stdout + res.stderr
    ref_w = consolidated_state_dict(ref_run / "checkpoints", "step00000008")
    got_w = consolidated_state_dict(run_dir / "checkpoints", "step00000008")
    assert ref_w.keys() == got_w.keys()
    different = [k for k in ref_w if not torch.equal(ref_w[k], got_w[k])]
    assert not different, f"{family}: {len(different)} tensors differ after the resume, e.g. {different[:3]}"
    got_rows = _rows(run_dir)
    for step in range(5, 9):
        for key in keys:
            assert got_rows[("train", step)][key] == ref_rows[("train", step)][key], (family, step, key)

    # Export: the family's HF folder, parity against the engine's logits, the card says RTD.
    run_module(["-m", "pretrain", "export", "--config", str(run_config), out, *overrides])
    export = run_dir / "export"
    state = json.loads((export / "training_state.json").read_text())
    assert state["parity_max_abs_diff"] is not None and state["parity_max_abs_diff"] <= 1e-5, state
    assert state["export_heads"]["AutoModelForSequenceClassification"].endswith("ForSequenceClassification")
    card = (export / "README.md").read_text()
    assert ("COCO-LM's sequence-contrastive loss" in card) == (family in EXTRA), card[:1500]
    assert "Trained by replaced-token detection" in card and "pipeline_tag: feature-extraction" in card, card[
        :800
    ]

    info = subprocess.run(
        [sys.executable, "-c", FINETUNE, str(export), str(tmp_path / "finetune")],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=300,
    )
    assert info.returncode == 0, info.stderr[-3000:]
    got = json.loads(info.stdout.strip().splitlines()[-1])
    assert got["class"].lower().startswith(family) and got["class"].endswith("ForSequenceClassification"), got
    assert 0 < got["loss"] < 10 and got["body_tensors_moved"] == got["body_tensors"], got
