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
        (
            "bert",
            "roberta-tiny",
            ["tokenizer.type=wordpiece", "tokenizer.vocab_size=2000", "tokenizer.lowercase=true"],
        ),
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
    assert (
        toks[0] == "<s>"
        and toks[-1] == "</s>"
        and ["</s>", "</s>"] == toks[toks.index("</s>") : toks.index("</s>") + 2]
    )
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


def test_gpt2_conventions_and_left_padded_generation(trained):
    """GPT-2's one special token `<|endoftext|>` (bos = eos = unk = pad), no RoBERTa tokens, left padding: a batched
    `generate` of the real GPT-2 model built from this tokenizer runs without the right-padding warning."""
    import logging

    import torch

    from pretrain.run.models import build_model

    cfg, path = trained["gpt2"]
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.convert_ids_to_tokens(0) == "<|endoftext|>" and tok.all_special_tokens == ["<|endoftext|>"]
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == tok.unk_token_id == 0
    assert not {"<s>", "</s>", "<pad>", "<mask>"} & set(tok.get_vocab())
    assert tok.padding_side == "left"
    conf = json.loads((path / "tokenizer_config.json").read_text())
    assert conf["tokenizer_class"] == "GPT2Tokenizer" and conf["padding_side"] == "left"

    torch.manual_seed(0)
    model = build_model(cfg.model, tok, cfg.packing.seq_len).eval()
    batch = tok(
        ["Shares rose.", "The BBC said on Tuesday that shares in the company rose"],
        padding=True,
        return_tensors="pt",
    )
    assert (batch["attention_mask"][0, 0] == 0) and (
        batch["attention_mask"][:, -1] == 1
    ).all()  # padded on the left
    logger = logging.getLogger("transformers.generation.utils")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        out = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    finally:
        logger.removeHandler(handler)
    assert out.shape == (2, batch["input_ids"].shape[1] + 3)
    assert not [m for m in seen if "right-padding" in m], seen


# decode(encode(x)) == x for every tokenizer kind; the exceptions are the conventions' own normalisations.
ROUND_TRIP = {
    "unicode": "Xbox sales in Qatar hit 5/10! Café, naïve, Zürich, São Paulo & #hashtags: 50% off, €5 — “quoted”.",
    "whitespace": "tabs\tand  double  spaces\nnew line\n\n  indented   ",
    "emoji": "Great match 😀👍🏽 🇬🇧 ⚽",
    "cjk": "日本語のテキスト 中文文本 한국어 텍스트",
}


@pytest.mark.parametrize("kind", ["roberta", "gpt2", "t5"])
@pytest.mark.parametrize("case", sorted(ROUND_TRIP))
def test_round_trip(trained, kind, case):
    _, path = trained[kind]
    tok = AutoTokenizer.from_pretrained(path)
    text = ROUND_TRIP[case]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids or kind == "gpt2"  # GPT-2's unk is its EOS; byte-level never emits it
    back = tok.decode(ids)
    if kind == "t5" and case == "whitespace":
        # T5's normaliser (SentencePiece nmt_nfkc) collapses whitespace runs, tabs and newlines to one space and
        # strips the ends: that is the convention, not a loss of content.
        assert back == " ".join(text.split())
    else:
        assert back == text


def test_wordpiece_round_trip_holds_modulo_bert_conventions(trained):
    """WordPiece follows BERT: punctuation split off, optional lower-casing and accent stripping, and no byte
    fallback in the model (a character outside the vocabulary is [UNK], counted by the <unk> report)."""
    _, path = trained["bert"]
    tok = AutoTokenizer.from_pretrained(path)
    text = "Xbox sales in Qatar hit 5/10! Shares rose 50%."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids).replace(" ", "") == text.lower().replace(" ", "")


def test_unk_rate_is_reported_and_enforced(trained, tmp_path):
    for kind in ("bert", "t5"):
        meta = json.loads((trained[kind][1] / "training_meta.json").read_text())
        assert meta["unk_rate_tokens"] > 10_000 and meta["unk_rate"] <= 0.001, (kind, meta)
        assert meta["unk_rate_basis"] == "sample", (kind, meta)
        # the sample stops at UNK_SAMPLE_TOKENS (100k, data_pipeline/tokenizers/checks.py), give or take one batch of 64 documents
        assert meta["unk_rate_tokens"] < 150_000, (kind, meta)
    for kind in ("roberta", "gpt2"):  # byte-level: checked on the vocabulary, no encoding pass
        meta = json.loads((trained[kind][1] / "training_meta.json").read_text())
        assert (meta["unk_rate"], meta["unk_rate_tokens"], meta["unk_rate_basis"]) == (
            0.0,
            0,
            "byte alphabet",
        ), meta
    # byte fallback
    assert json.loads((trained["t5"][1] / "training_meta.json").read_text())["unk_rate"] == 0.0
    # Without byte fallback the Unigram vocabulary drops rare characters of the BBC text (X, Q, /, £, ...): the
    # report catches it and training fails, naming the key.
    cfg = bbc_config(
        tmp_path,
        "t5-tiny",
        ["tokenizer.vocab_size=2000", "tokenizer.byte_fallback=false", "tokenizer.max_unk_rate=0.0001"],
        limit=400,
    )
    with pytest.raises(
        ValueError, match=r"tokenizer.max_unk_rate: .*% of tokens are <unk>.*byte_fallback=true"
    ):
        train_tokenizer(cfg)
    assert not (tmp_path / "tokenizer").exists()


def test_byte_level_bpe_unk_check_is_structural():
    """A byte-level BPE has no <unk>: a byte outside its vocabulary is dropped from the text without a trace, so
    counting <unk> ids said 0% for a vocabulary that lost characters. The check is on the 256-byte alphabet."""
    from tokenizers import pre_tokenizers

    from data_pipeline.tokenizers import bpe_tokenizer, unk_rate

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    full = bpe_tokenizer({c: i for i, c in enumerate(alphabet)}, [])
    assert unk_rate(full, iter(["café"])) == (0.0, 0)
    lossy = bpe_tokenizer({c: i for i, c in enumerate(c for c in alphabet if c not in "Ã©")}, [])
    assert len(lossy.encode("café").ids) == 3  # é's two bytes vanished
    with pytest.raises(ValueError, match=r"byte-level BPE vocabulary lacks 2 of the 256 bytes"):
        unk_rate(lossy, iter(["café"]))


def test_byte_fallback_needs_vocabulary_room(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.vocab_size: 400 leaves no room for the 256 byte pieces"):
        bbc_config(tmp_path, "t5-tiny", ["tokenizer.vocab_size=400"], limit=1)


def test_folder_is_portable_to_transformers_4(trained):
    """What transformers 4.40 needs (tests/pretrain/test_export_compat.py loads it there): a class 4.x knows,
    extra special tokens under `additional_special_tokens`, BPE merges as "a b" strings."""
    expected = {
        "roberta": "RobertaTokenizer",
        "gpt2": "GPT2Tokenizer",
        "bert": "BertTokenizer",
        "t5": "PreTrainedTokenizerFast",
    }
    for kind, cls in expected.items():
        path = trained[kind][1]
        conf = json.loads((path / "tokenizer_config.json").read_text())
        assert conf["tokenizer_class"] == cls and "extra_special_tokens" not in conf
        merges = json.loads((path / "tokenizer.json").read_text())["model"].get("merges") or ["a b"]
        assert all(isinstance(m, str) for m in merges)
    assert (
        len(json.loads((trained["t5"][1] / "tokenizer_config.json").read_text())["additional_special_tokens"])
        == 100
    )
    assert json.loads((trained["bert"][1] / "tokenizer_config.json").read_text())["do_lower_case"] is True


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
    assert (
        tok.convert_tokens_to_ids("<extra_id_0>") == 1999
        and tok.convert_tokens_to_ids("<extra_id_99>") == 1900
    )
    ids = tok("A b")["input_ids"]
    assert ids[-1] == 1 and tok("x", "y")["input_ids"].count(1) == 2  # A </s> / A </s> B </s>
    # the converted fast tokenizer encodes exactly like the SentencePiece model it came from
    sp = spm.SentencePieceProcessor(model_file=str(path / "spiece.model"))
    from tests.data_pipeline.tokens_fixtures import bbc_docs

    texts = [d["text"] for d in bbc_docs(limit=60)] + [
        "  spaces   and\ttabs\n\nnewlines  ",
        "Ünïcödé ﬁ ligature ①",
    ]
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
    assert (
        out != src
        and AutoTokenizer.from_pretrained(out)(TEXT)["input_ids"]
        == AutoTokenizer.from_pretrained(src)(TEXT)["input_ids"]
    )


def test_stage_banner_describes_the_configured_tokenizer():
    """`launch pipeline` prints this: derived from the config, not a fixed "byte-level BPE"."""
    from data_pipeline.tokenizers import describe
    from runconfig import load_config

    assert describe(load_config("configs/t5-tiny.yaml")) == (
        "SentencePiece Unigram with byte fallback, vocabulary 8,000, t5 special tokens"
    )
    assert describe(load_config("configs/gpt2-tiny.yaml", ["tokenizer.vocab_size=4000"])) == (
        "byte-level BPE, vocabulary 4,000, gpt2 special tokens"
    )
    assert describe(load_config("configs/roberta-tiny.yaml", ["tokenizer.type=wordpiece"])).startswith(
        "WordPiece"
    )


def test_paragraphs_for_sentencepiece_are_cut_within_the_byte_limit():
    """SentencePiece skips lines over max_sentence_length bytes: long paragraphs are cut at a space inside the
    limit (counted in UTF-8 bytes, so accented text is cut earlier); short ones pass unchanged, blank lines go."""
    from data_pipeline.tokenizers.trainers import _paragraphs

    long = " ".join(["café"] * 30)  # 149 characters, 179 bytes
    out = list(_paragraphs(iter(["  short one \n\n" + long, "x" * 40]), max_bytes=40))
    assert out[0] == "short one" and out[-1] == "x" * 40
    pieces = out[1:-1]
    assert " ".join(pieces) == long and all(len(p.encode()) <= 40 for p in pieces)
    assert all(p.startswith("café") and p.endswith("café") for p in pieces)
