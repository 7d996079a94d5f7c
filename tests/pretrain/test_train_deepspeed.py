"""The real DeepSpeed engine on 2 CPU ranks (gloo) for all three families: train, checkpoint, resume, export,
parity of the reloaded export with the engine's logits, and the downstream heads loading the export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.checkpoint import complete_tags
from tests.pretrain.conftest import ROOT, child_env, run_module, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420)]


def isolated(config: Path, tmp_path: Path) -> str:
    """A fresh run folder sharing the prepared tokenizer and token shards."""
    src = config.parent / "run"
    out = tmp_path / "run"
    out.mkdir()
    for name in ("clean", "dedup", "tokenizer", "tokens"):
        (out / name).symlink_to((src / name).resolve())
    return f"run.output_dir={out}"


LOAD_HEADS = """
import json, sys, torch
from transformers import (AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer)
path, family = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
main = {"roberta": AutoModelForMaskedLM, "gpt2": AutoModelForCausalLM, "t5": AutoModelForSeq2SeqLM}[family]
probe = torch.load(path + "/../checkpoints/" + json.load(open(path + "/training_state.json"))["checkpoint"].split("/")[-1]
                   + "/parity_probe.pt", weights_only=False)
model = main.from_pretrained(path).eval()
with torch.no_grad():
    diff = (model(**probe["inputs"]).logits - probe["logits"]).abs().max().item()
heads = []
enc = tok(["A short sentence about markets.", "Another one."], padding=True, return_tensors="pt")
enc.pop("token_type_ids", None)
if family in ("roberta", "gpt2"):
    m = AutoModelForSequenceClassification.from_pretrained(path, num_labels=5)
    if m.config.pad_token_id is None:
        m.config.pad_token_id = tok.pad_token_id
    heads.append(list(m(**enc).logits.shape))
if family == "roberta":
    heads.append(list(AutoModelForTokenClassification.from_pretrained(path, num_labels=3)(**enc).logits.shape))
a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in ("hello world", "good morning"))
pair = tok("hello world", "good morning")["input_ids"]  # issue 66: a separator between a pair's texts
print(json.dumps({"diff": diff, "heads": heads, "class": type(model).__name__, "pair": [a, b, pair]}))
"""


def _export_and_check(config: Path, out_override: str, family: str) -> dict:
    run_module(["-m", "pretrain", "export", "--config", str(config), out_override])
    export = Path(out_override.split("=", 1)[1]) / "export"
    for f in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (export / f).is_file(), f
    card = (export / "README.md").read_text()
    header = card.split("\n---\n", 1)[0]  # the YAML front matter huggingface_hub writes (keys sorted)
    assert card.startswith("---\n") and "\nlicense: apache-2.0\n" in header and "\npipeline_tag: " in header
    assert "tokens seen" in card
    assert (export / "data_manifest.json").is_file() and (export / "resolved_config.yaml").is_file()
    state = json.loads((export / "training_state.json").read_text())
    assert state["parity_max_abs_diff"] is not None and state["parity_max_abs_diff"] <= 1e-5
    res = subprocess.run(
        [sys.executable, "-c", LOAD_HEADS, str(export), family],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["diff"] <= 1e-5, info  # a fresh process, plain transformers, same logits as the engine
    a, b, pair = info["pair"]
    end = next(i for i in range(len(pair)) if pair[i : i + len(a)] == a) + len(a)
    # issue 66: the export's tokenizer(a, b) puts a separator between the texts, as fine-tuning frames a pair
    assert pair[end : end + len(b)] != b, info["pair"]
    return info | {"export": export, "state": state}


@pytest.mark.timeout(480)
def test_roberta_zero2_train_checkpoint_resume_export(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    run_dir = Path(out.split("=", 1)[1])
    torchrun(roberta_run, [out, "logging.plots=true"])
    ckpts = run_dir / "checkpoints"
    assert complete_tags(ckpts) == ["step00000004", "step00000008"]
    assert (ckpts / "latest").read_text() == "step00000008"
    assert (run_dir / "resolved_config.yaml").is_file() and (ckpts / "resolved_config.yaml").is_file()
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    for key in (
        "loss",
        "lr",
        "grad_norm",
        "loss_scale",
        "tokens_per_s",
        "samples_per_s",
        "mfu",
        "loader_wait_frac",
        "memory_mb",
    ):
        assert key in train_rows[-1], key
    assert any(r["split"] == "eval" and "perplexity" in r for r in rows)
    assert list((run_dir / "logs").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert (run_dir / "logs" / "plots" / "loss.png").is_file()  # curves written at the end of training
    assert all("time" in r for r in rows)

    res = torchrun(roberta_run, [out, "schedule.total_steps=12"])
    assert "resumed from" in res.stdout + res.stderr and "step 8" in res.stdout + res.stderr
    # the training log says the rule
    assert "[train] lr_scaling: none (peak LR 0.001 = optim.lr" in res.stdout
    assert complete_tags(ckpts) == ["step00000008", "step00000012"]  # keep_last: 2
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in rows if r["split"] == "train" and "resume_first_batch_s" in r]
    # The resumed run's first row says how long the loader took from its saved state to the first batch in hand.
    assert [r["step"] for r in resumed] == [10] and 0 < resumed[0]["resume_first_batch_s"] < 30, resumed

    info = _export_and_check(roberta_run, out, "roberta")
    assert info["class"] == "RobertaForMaskedLM" and info["heads"] == [[2, 5], [2, info["heads"][1][1], 3]]
    assert info["state"]["step"] == 12


def test_gpt2_zero1_document_masking_export(gpt2_run, tmp_path):
    out = isolated(gpt2_run, tmp_path)
    # ZeRO-1 with the optimizer offloaded to CPU and activation checkpointing, plus document masking.
    torchrun(
        gpt2_run,
        [
            out,
            "deepspeed.zero_stage=1",
            "objective.document_masking=true",
            "deepspeed.offload_optimizer=true",
            "deepspeed.activation_checkpointing=true",
        ],
    )
    info = _export_and_check(gpt2_run, out, "gpt2")
    assert info["class"] == "GPT2LMHeadModel" and info["heads"] == [[2, 5]]
    gen = json.loads((info["export"] / "generation_config.json").read_text())
    cfg = json.loads((info["export"] / "config.json").read_text())
    tok_len = len(json.loads((info["export"] / "tokenizer.json").read_text())["model"]["vocab"])
    assert cfg["vocab_size"] % 8 == 0 and cfg["vocab_size"] >= tok_len
    assert (
        gen.get("suppress_tokens", []) == list(range(tok_len, cfg["vocab_size"]))
        or cfg["vocab_size"] == tok_len
    )


def test_t5_zero3_export_gathers_shards(t5_run, tmp_path):
    out = isolated(t5_run, tmp_path)
    torchrun(t5_run, [out, "deepspeed.zero_stage=3"])
    tag_dir = Path(out.split("=", 1)[1]) / "checkpoints" / "step00000008"
    assert len(list(tag_dir.glob("*optim_states.pt"))) == 2  # sharded across both ranks
    info = _export_and_check(t5_run, out, "t5")
    assert info["class"] == "T5ForConditionalGeneration"


def test_bf16_trains_and_exports_fp32_master_weights(roberta_run, tmp_path):
    """bf16 mixed precision through DeepSpeed on CPU ranks; the export carries the fp32 master weights, so its
    logits differ from the bf16 engine's only by bf16 rounding (fp32 runs are held to 1e-5 above)."""
    out = isolated(roberta_run, tmp_path)
    torchrun(roberta_run, [out, "deepspeed.precision=bf16", "schedule.total_steps=4"])
    run_module(["-m", "pretrain", "export", "--config", str(roberta_run), out, "deepspeed.precision=bf16"])
    export = Path(out.split("=", 1)[1]) / "export"
    state = json.loads((export / "training_state.json").read_text())
    assert 0 < state["parity_max_abs_diff"] < 0.1
    assert json.loads((export / "config.json").read_text())["dtype"] == "float32"
