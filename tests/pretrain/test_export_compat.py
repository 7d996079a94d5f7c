"""Every registered family's export loads in the oldest transformers its model card names
(FamilySpec.min_transformers: 4.40, ModernBERT 4.48), one cached side venv per version.

A downstream team may pin an older transformers than the one we train with. This test builds (once, cached in the
gitignored `.venv-compat-tf440/`) a separate venv with transformers 4.40 and the CPU torch, writes an exported
folder per family exactly as `pretrain.export.convert` does (frame_pairs, model.save_pretrained, tokenizer.save_pretrained,
make_portable), and loads it there with AutoTokenizer / AutoModel*: the token ids and the logits must equal what
the training-side transformers computes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch.side_venv import ensure_venv
from pretrain.families import family_names, get_family

# slow: the first test builds a venv with torch and transformers 4.40 from PyPI (cached afterwards).
pytestmark = [pytest.mark.integration, pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
OLDEST = "4.40.*"
VENV = ROOT / ".venv-compat-tf440"
REQUIREMENTS = ["torch==2.13.0", f"transformers=={OLDEST}", "sentencepiece", "protobuf"]
# Export task per family task: which Auto class the probe loads it with.
PROBE_TASK = {"masked_lm": "mlm", "causal_lm": "clm", "seq2seq": "s2s", "token_detection": "pre"}
TEXTS = [
    "Xbox sales in Qatar hit 5/10! Café prices rose 5%.",
    "日本語 😀 and a longer second sentence about markets.",
]

PROBE = r"""
import json, sys, torch, transformers
from transformers import AutoTokenizer, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM
from transformers import AutoModelForPreTraining, AutoModelForSequenceClassification
path, task = sys.argv[1], sys.argv[2]
texts = json.loads(sys.argv[3])
tok = AutoTokenizer.from_pretrained(path)
enc = tok(texts, padding=True, return_tensors="pt")
enc.pop("token_type_ids", None)
cls = {"mlm": AutoModelForMaskedLM, "clm": AutoModelForCausalLM, "s2s": AutoModelForSeq2SeqLM,
       "pre": AutoModelForPreTraining}[task]
model = cls.from_pretrained(path).eval()
# Logits of one unpadded sequence: with left padding, 5.x derives GPT-2's positions from the mask, 4.40 does not.
one = tok(texts[1:], return_tensors="pt")
one.pop("token_type_ids", None)
with torch.no_grad():
    if task == "s2s":
        logits = model(**one, decoder_input_ids=one["input_ids"][:, :4]).logits
    else:
        logits = model(**one).logits
heads = None
if task != "s2s":
    clf = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)
    heads = list(clf(**enc).logits.shape)
print(json.dumps({"version": transformers.__version__, "tokenizer": type(tok).__name__,
                  "ids": enc["input_ids"].tolist(), "decoded": [tok.decode(i, skip_special_tokens=True)
                  for i in tok(texts, add_special_tokens=False)["input_ids"]],
                  "padding_side": tok.padding_side, "pad": tok.pad_token, "eos": tok.eos_token,
                  "logits": logits.flatten()[:2000].tolist(), "heads": heads,
                  "pair": tok(texts[0], texts[1])["input_ids"]}))
"""


def _pip_list(python: Path) -> str:
    return subprocess.run(
        [str(python), "-m", "pip", "list"], capture_output=True, text=True, check=True
    ).stdout


def old_python(version: str) -> Path:
    """The cached venv with transformers `version`.* (built here when missing: needs PyPI)."""
    venv = VENV if version == "4.40" else ROOT / f".venv-compat-tf{version.replace('.', '')}"
    reqs = [r if not r.startswith("transformers==") else f"transformers=={version}.*" for r in REQUIREMENTS]
    python = ensure_venv(venv, reqs, probe="import torch, transformers")
    listing = _pip_list(python).lower()
    assert "nvidia" not in listing, "the compat venv pulled CUDA wheels"
    return python


def _export(tmp: Path, preset: str) -> tuple[Path, object]:
    """An export folder written by the same calls as pretrain.export.convert (random weights: compatibility, not quality)."""
    import torch

    from data_pipeline.tokenizers import frame_pairs, load_tokenizer, make_portable, train_tokenizer
    from pretrain.run.models import build_model
    from tests.data_pipeline.tokens_fixtures import bbc_config

    cfg = bbc_config(tmp, preset, ["tokenizer.vocab_size=2000"], limit=300)
    tok = load_tokenizer(train_tokenizer(cfg))
    frame_pairs(tok)  # as pretrain.export.convert: a separator between a pair's texts (GPT-2, Llama)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, cfg.packing.seq_len).eval()
    out = tmp / "export"
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    make_portable(out)
    return out, model


@pytest.mark.parametrize("family", family_names())
def test_export_loads_in_oldest_supported_transformers(tmp_path, family):
    spec = get_family(family)
    preset, task = f"{family}-tiny", PROBE_TASK[spec.task]
    old_python_ = old_python(spec.min_transformers)
    out, _ = _export(tmp_path, preset)
    new = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), task, json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    old = subprocess.run(
        [str(old_python_), "-c", PROBE, str(out), task, json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert new.returncode == 0, new.stderr[-3000:]
    assert old.returncode == 0, old.stderr[-3000:]
    a, b = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (new, old))
    assert b["version"].startswith(spec.min_transformers + ".") and a["version"].split(".")[0] == "5"
    assert b["ids"] == a["ids"] and b["decoded"] == a["decoded"], (a["decoded"], b["decoded"])
    assert b["pair"] == a["pair"]  # tokenizer(a, b): the saved pair template, in both generations
    from runconfig import load_config

    if load_config(ROOT / "configs" / f"{preset}.yaml").tokenizer.type != "wordpiece":
        # byte fallback: exact round trips (WordPiece, ELECTRA's, splits punctuation and drops unknown words)
        assert a["decoded"] == TEXTS, a["decoded"]
    assert (b["padding_side"], b["pad"], b["eos"]) == (a["padding_side"], a["pad"], a["eos"])
    assert max(abs(x - y) for x, y in zip(a["logits"], b["logits"], strict=True)) < 1e-4
    assert b["heads"] == a["heads"]
    if task == "clm":
        assert b["padding_side"] == "left" and b["pad"] == b["eos"] == "<|endoftext|>"
