"""The in-loop transfer probe (eval.probe_task, pretrain/run/probe_eval.py) on a tiny real model and a tiny task: its
accuracy is a fraction, above chance where the labels are separable from the words, it finds the body of every
model shape the trainer holds, and it leaves the training RNG where it was (exact resume needs that)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

from pretrain.run.probe_eval import STATE_KEY, ProbeSplit, TransferProbe, feature_body, probe_figures
from runconfig import load_config
from tests.adapt.tiny_text import word_tokenizer

DEMO = str(Path(__file__).resolve().parents[2] / "configs/demo.yaml")


def _tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2))


def _separable(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Label 0 draws its words from w0-w19, label 1 from w30-w49: a linear probe on pooled states can tell them."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n)
    texts = [" ".join(f"w{int(i) + 30 * int(y)}" for i in rng.integers(0, 20, size=12)) for y in labels]
    return texts, labels


def _split(tok, texts: list[str], labels: np.ndarray) -> ProbeSplit:
    return ProbeSplit(tok(texts, truncation=True, max_length=32)["input_ids"], labels)


def test_probe_accuracy_is_a_fraction_above_chance_on_a_separable_task():
    tok = word_tokenizer()
    train, dev = _split(tok, *_separable(120, 0)), _split(tok, *_separable(60, 1))
    model = _tiny_gpt2()
    model.train()
    rng = torch.get_rng_state()
    out = probe_figures(model, train, dev, pad_id=0, length=32, batch_size=16, max_seconds=60)
    assert torch.equal(torch.get_rng_state(), rng), "the probe moved the global RNG"
    assert model.training, "the probe left the model in eval mode"
    assert 0.0 <= out["probe/accuracy"] <= 1.0 and 0.0 <= out["probe/train_accuracy"] <= 1.0
    chance = max(np.bincount(dev.labels)) / len(dev.labels)
    assert out["probe/accuracy"] > chance + 0.2, out
    assert out["probe/train_examples"] == 120 and out["probe/dev_examples"] == 60

    # labels that the words do not carry: the probe must not find them (no leak from the fit into the score)
    shuffled = ProbeSplit(dev.ids, np.random.default_rng(5).permutation(dev.labels))
    noise = probe_figures(model, train, shuffled, pad_id=0, length=32, batch_size=16, max_seconds=60)
    assert noise["probe/accuracy"] < out["probe/accuracy"] - 0.2, (noise, out)


def test_time_bound_spent_gives_no_figure():
    tok = word_tokenizer()
    train, dev = _split(tok, *_separable(40, 0)), _split(tok, *_separable(20, 1))
    out = probe_figures(_tiny_gpt2(), train, dev, pad_id=0, length=32, batch_size=8, max_seconds=1e-9)
    assert np.isnan(out["probe/accuracy"]) and out["probe/train_examples"] == 0


def test_feature_body_of_each_model_shape():
    gpt2 = _tiny_gpt2()
    assert feature_body(gpt2) is gpt2.transformer
    t5 = T5ForConditionalGeneration(
        T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
    )
    assert feature_body(t5) is t5.get_encoder()


def test_transfer_probe_from_a_config_with_its_random_init_kept(tmp_path):
    """The whole TransferProbe on a labelled file task: the random-init figure is measured at step 0, carried in
    the state, and a resumed probe takes it from there instead of measuring trained weights."""
    texts, labels = _separable(200, 3)
    rows = [
        json.dumps({"id": str(i), "text": t, "label": f"c{y}"})
        for i, (t, y) in enumerate(zip(texts, labels, strict=True))
    ]
    (tmp_path / "easy.jsonl").write_text("\n".join(rows) + "\n")
    cfg = load_config(
        DEMO,
        [
            f"finetune.tasks=[{{name: easy, train: {tmp_path / 'easy.jsonl'}}}]",
            "eval.probe_task=easy",
            "finetune.max_length=32",
        ],
    )
    tok = word_tokenizer()
    probe = TransferProbe.from_config(cfg, tok, rank=0, max_examples=80)  # a tiny task's own cap
    assert probe is not None and len(probe.train.labels) == 80 and 0 < len(probe.dev.labels) <= 80
    model = _tiny_gpt2()
    first = probe.start(model, None, step=0)
    assert first["probe/random_init_accuracy"] == first["probe/accuracy"] > 0.5
    state = probe.state()
    assert state["task"] == "easy" and state["accuracy"] == first["probe/accuracy"]

    later = probe.measure(_tiny_gpt2(seed=1))
    assert (
        later["probe/random_init_accuracy"] == first["probe/accuracy"] and "probe/majority_accuracy" in later
    )

    resumed = TransferProbe.from_config(cfg, tok, rank=0)
    assert resumed.start(_tiny_gpt2(seed=1), {**state}, step=40) == {}  # nothing measured again
    assert resumed.state() == state
    fresh_key = TransferProbe.from_config(cfg, tok, rank=0)
    assert fresh_key.start(_tiny_gpt2(seed=1), None, step=40) == {} and fresh_key.state() is None
    assert STATE_KEY == "probe_random_init"
    assert TransferProbe.from_config(load_config(DEMO), tok, rank=0) is None


@pytest.mark.parametrize("rank", [1])
def test_other_ranks_read_no_task(rank):
    cfg = load_config(DEMO, ["eval.probe_task=bbc"])
    probe = TransferProbe(cfg, word_tokenizer(), rank)
    assert len(probe.train.labels) == 0 and probe.measure(_tiny_gpt2()) == {}
