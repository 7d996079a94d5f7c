"""bench/objective_parity.py: the T5 reference recipe it compares against, and the verdicts: our objectives pass,
and each sabotage of our side (10% masking, labels shifted by one) fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import objective_parity as op  # noqa: E402

from data_pipeline.objectives.t5_lengths import t5_lengths  # noqa: E402


def _t5_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>", *[f"w{i}" for i in range(200)]]
    vocab = {w: i for i, w in enumerate(words)}
    for k in range(100):  # T5 layout: <extra_id_0> is the highest id
        vocab[f"<extra_id_{k}>"] = len(words) + 99 - k
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=[f"<extra_id_{k}>" for k in range(100)],
    )
    return tok


@pytest.mark.timeout(60)
def test_noise_mask_follows_the_t5_recipe():
    rng = np.random.default_rng(0)
    raw, _ = t5_lengths(128)
    for _ in range(50):
        m = op.random_spans_noise_mask(raw, 0.15, 3.0, rng)
        starts = np.flatnonzero(np.diff(np.concatenate([[0], m.astype(int)])) == 1)
        assert m.sum() == round(raw * 0.15) and len(starts) == round(round(raw * 0.15) / 3) and not m[0]


@pytest.mark.timeout(60)
def test_reference_t5_collator_round_trips_with_sentinels_in_span_order():
    tok = _t5_tokenizer()
    raw, target = t5_lengths(128)
    ids = np.random.default_rng(1).integers(3, 203, size=(4, raw))
    coll = op.ReferenceT5Collator(tok, 0.15, 3.0, 128, target, seed=3)
    out = coll([{"input_ids": r} for r in ids])
    assert out["input_ids"].shape == (4, 128) and out["labels"].shape == (4, target)
    sent = {tok.convert_tokens_to_ids(f"<extra_id_{k}>"): k for k in range(100)}
    for row, inp, lab in zip(ids, out["input_ids"].tolist(), out["labels"].tolist(), strict=True):
        assert inp[-1] == lab[-1] == tok.eos_token_id
        # rebuild the original: each input sentinel k is replaced by the target span after target sentinel k
        spans, k = {}, None
        for t in lab[:-1]:
            if t in sent:
                k = sent[t]
                spans[k] = []
            else:
                spans[k].append(t)
        assert [sent[t] for t in inp if t in sent] == list(range(len(spans)))
        rebuilt = [x for t in inp[:-1] for x in (spans[sent[t]] if t in sent else [t])]
        assert rebuilt == row.tolist()


@pytest.mark.timeout(60)
def test_shift_labels_moves_labels_and_keeps_t5_decoder_inputs():
    labels = torch.tensor([[5, 6, 7, 1]])
    out = op.shift_labels({"input_ids": torch.tensor([[9, 9]]), "labels": labels}, pad_id=0)
    assert out["labels"].tolist() == [[-100, 5, 6, 7]]
    assert out["decoder_input_ids"].tolist() == [[0, 5, 6, 7]]  # what T5 derives from the true labels
    assert "decoder_input_ids" not in op.shift_labels({"labels": labels}, pad_id=None)


VERDICT = re.compile(
    r"^VERDICT objective_parity_(\w+): ours=[\d.]+ peer=[\d.]+ diff=[\d.]+ tolerance=[\d.]+ "
    r"(pass|fail)$",
    re.M,
)


def _run(objective: str, *extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "objective_parity.py"),
            "--quick",
            "--objectives",
            objective,
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    verdicts = dict(VERDICT.findall(res.stdout))
    assert verdicts, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.returncode == (0 if set(verdicts.values()) == {"pass"} else 1), res.stdout[-2000:]
    return verdicts


# Our side as shipped and each sabotage of it, in one run against one reference per seed (the reference does not
# depend on our side): as shipped must pass, every sabotage must fail its own verdict.
@pytest.mark.integration
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("objective", op.OBJECTIVES)
def test_our_objective_matches_its_reference_and_each_sabotage_fails(objective):
    verdicts = _run(objective, "--sabotage", "none", *op.SABOTAGES)
    assert verdicts == {
        objective: "pass",
        **{f"{objective}_sabotaged_{name}": "fail" for name in op.SABOTAGES},
    }, verdicts


@pytest.mark.timeout(60)
def test_alignment_check_accepts_the_reference_and_rejects_shifted_labels():
    tok = _t5_tokenizer()
    raw, target = t5_lengths(128)
    samples = [{"input_ids": r} for r in np.random.default_rng(2).integers(3, 203, size=(3, raw))]
    batch = op.ReferenceT5Collator(tok, 0.15, 3.0, 128, target, seed=4)(samples)
    sent = {tok.convert_tokens_to_ids(f"<extra_id_{k}>"): k for k in range(100)}
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert op.aligned_rows("span_corruption", batch, samples, pad, sent, eos) == 3
    assert op.aligned_rows("span_corruption", op.shift_labels(batch, pad), samples, pad, sent, eos) == 0
    # MLM: labels are the sample's own tokens at the labelled positions
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    mlm = {"input_ids": ids.clone(), "labels": torch.tensor([[-100, 6, -100, 8], [9, -100, -100, -100]])}
    rows = [{"input_ids": r.numpy()} for r in ids]
    assert op.aligned_rows("mlm", mlm, rows, 0, {}, 1) == 2
    assert op.aligned_rows("mlm", op.shift_labels(mlm, None), rows, 0, {}, 1) == 0
