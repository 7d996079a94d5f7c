"""Tokenizer training on real BBC text: special-token layout per family, HF loading, post-processing."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from data_pipeline.tokenizers import train_tokenizer
from tests.data_pipeline.tokens_fixtures import bbc_config

TEXT = "The BBC said on Tuesday that shares rose 5%. Mr Blair disagreed."


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = {}
    for name, preset, ov in [
        ("roberta", "roberta-tiny", ["tokenizer.vocab_size=2000"]),
        ("gpt2", "gpt2-tiny", ["tokenizer.vocab_size=2000"]),
        ("bert", "roberta-tiny", ["tokenizer.type=wordpiece", "tokenizer.vocab_size=2000", "tokenizer.lowercase=true"]),
        ("t5", "t5-tiny", ["tokenizer.vocab_size=2000"]),
    ]:
        tmp = tmp_path_factory.mktemp(name)
        cfg = bbc_config(tmp, preset, ov, limit=400)
        out[name] = (cfg, train_tokenizer(cfg))
    return out


def test_bpe_roberta_layout_and_pairs(trained):
    cfg, path = trained["roberta"]
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 2000
    assert tok.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]) == [0, 1, 2, 3, 4]
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.mask_token_id) == (0, 1, 2, 4)
    ids = tok("Hello there", "General Kenobi")["input_ids"]
    toks = tok.convert_ids_to_tokens(ids)
    # RoBERTa pair format: <s> A </s></s> B </s>
    assert toks[0] == "<s>" and toks[-1] == "</s>" and ["</s>", "</s>"] == toks[toks.index("</s>") : toks.index("</s>") + 2]
    # byte-level: any text round-trips, nothing is <unk>
    odd = "naïve café — 日本語 😀"
    enc = tok(odd, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in enc and tok.decode(enc) == odd
    # <mask> is recognised inside text (lstrip like RoBERTa)
    assert tok.mask_token_id in tok("The <mask> rose.")["input_ids"]


def test_bpe_gpt2_adds_no_specials(trained):
    _, path = trained["gpt2"]
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(TEXT)["input_ids"]
    assert ids == tok(TEXT, add_special_tokens=False)["input_ids"] and tok.decode(ids) == TEXT
    assert tok.eos_token_id == 2


def test_wordpiece_bert_layout_lowercase(trained):
    _, path = trained["bert"]
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    enc = tok("Hello World", "Second")
    toks = tok.convert_ids_to_tokens(enc["input_ids"])
    assert toks[0] == "[CLS]" and toks.count("[SEP]") == 2 and toks[-1] == "[SEP]"
    assert enc["token_type_ids"][-1] == 1 and enc["token_type_ids"][0] == 0
    assert tok("SHARES ROSE")["input_ids"] == tok("shares rose")["input_ids"]


def test_unigram_t5_layout_matches_sentencepiece(trained):
    import sentencepiece as spm

    _, path = trained["t5"]
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 2000
    assert tok.convert_tokens_to_ids(["<pad>", "</s>", "<unk>"]) == [0, 1, 2]
    assert tok.convert_tokens_to_ids("<extra_id_0>") == 1999 and tok.convert_tokens_to_ids("<extra_id_99>") == 1900
    ids = tok("A b")["input_ids"]
    assert ids[-1] == 1 and tok("x", "y")["input_ids"].count(1) == 2  # A </s> / A </s> B </s>
    # the converted fast tokenizer encodes exactly like the SentencePiece model it came from
    sp = spm.SentencePieceProcessor(model_file=str(path / "spiece.model"))
    from tests.data_pipeline.tokens_fixtures import bbc_docs

    texts = [d["text"] for d in bbc_docs(limit=60)] + ["  spaces   and\ttabs\n\nnewlines  ", "Ünïcödé ﬁ ligature ①"]
    for t in texts:
        assert tok(t, add_special_tokens=False)["input_ids"] == sp.encode(t), t[:80]


def test_training_meta_and_atomic_rerun(trained):
    cfg, path = trained["gpt2"]
    meta = json.loads((path / "training_meta.json").read_text())
    assert meta["type"] == "bpe" and meta["vocab_size"] == 2000
    before = (path / "tokenizer.json").read_bytes()
    train_tokenizer(cfg)  # retraining on the same corpus is deterministic and replaces the folder whole
    assert (path / "tokenizer.json").read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tokenizer")]


def test_empty_corpus_is_a_clear_error(tmp_path):
    cfg = bbc_config(tmp_path, "roberta-tiny", limit=1)
    for p in (tmp_path / "clean").rglob("*"):
        if p.is_file():
            p.unlink()
    with pytest.raises(FileNotFoundError, match="clean"):
        train_tokenizer(cfg)


def test_pretrained_path_is_copied_into_the_run(trained, tmp_path):
    _, src = trained["gpt2"]
    cfg = bbc_config(tmp_path, "gpt2-tiny", [f"tokenizer.pretrained_path={src}"], limit=5)
    out = train_tokenizer(cfg)
    assert out != src and AutoTokenizer.from_pretrained(out)(TEXT)["input_ids"] == AutoTokenizer.from_pretrained(
        src)(TEXT)["input_ids"]  # fmt: skip
