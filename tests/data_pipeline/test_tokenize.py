"""Tokenize stage on real BBC text: exact tokens, sentence index, manifest checksums, restart and bad rows."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer

from core.run_layout import RunLayout
from data_pipeline.shards import ShardMismatchError, mark_done, write_shard
from data_pipeline.token_shards import TokenShardWriter, open_token_shards, sha256_file, smallest_dtype
from data_pipeline.tokenize import SentenceSplitter, run_tokenize
from data_pipeline.tokenizers.corpus import corpus_shards, read_shard
from tests.data_pipeline.tokens_fixtures import tokenized_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tokenized_run(tmp_path_factory.mktemp("tok"), limit=450, per_shard=150)


def test_tokens_are_the_tokenizers_and_manifest_checks_out(run):
    layout = RunLayout(run)
    tok = Tokenizer.from_file(str(layout.tokenizer / "tokenizer.json"))
    manifest, shards = open_token_shards(str(layout.tokens), verify=True)
    assert manifest["complete"] and manifest["dtype"] == "uint16"
    assert manifest["special_ids"]["bos"] == 0 and manifest["special_ids"]["eos"] == 2
    src = corpus_shards(run)["bbc"]
    assert len(shards["bbc"]) == len(src) == 3
    total = 0
    for meta, sh, clean in zip(manifest["sources"]["bbc"]["shards"], shards["bbc"], src, strict=True):
        assert (
            sh.tokens.dtype == np.uint16
            and sh.num_tokens == meta["tokens"] == os.path.getsize(sh.bin_path) // 2
        )
        assert sha256_file(sh.bin_path) == meta["sha256_bin"]
        rows = list(read_shard(clean))
        assert list(sh.doc_ids()) == [r["id"] for r in rows]
        for i in (0, len(rows) // 2, len(rows) - 1):
            assert sh.doc(i).tolist() == tok.encode(rows[i]["text"], add_special_tokens=False).ids
        total += sh.num_tokens
    assert manifest["totals"]["tokens"] == total > 100_000


def test_sentence_index_follows_the_splitter(run):
    layout = RunLayout(run)
    tok = Tokenizer.from_file(str(layout.tokenizer / "tokenizer.json"))
    _, shards = open_token_shards(str(layout.tokens))
    sh = shards["bbc"][0]
    rows = list(read_shard(corpus_shards(run)["bbc"][0]))
    split = SentenceSplitter("blingfire")
    for d in (0, 7, 42):
        text = rows[d]["text"]
        starts = [0, *split.starts(text).tolist(), len(text)]
        want = [text[a:b].strip() for a, b in zip(starts, starts[1:], strict=False) if text[a:b].strip()]
        so = sh.sent_offsets
        lo, hi = np.searchsorted(so, [sh.doc_offsets[d], sh.doc_offsets[d + 1]])
        got = [tok.decode(sh.tokens[so[k] : so[k + 1]].tolist()).strip() for k in range(lo, hi)]
        assert got == want
        assert len(got) > 3


def test_rerun_skips_finished_shards_and_redoes_stale_ones(run):
    layout = RunLayout(run)
    before = {p.name: p.read_bytes() for p in (layout.tokens / "bbc").glob("*.bin")}
    r = run_tokenize(run)
    assert r["shards_reused"] == 3 and r["shards_written"] == 0
    # a crash mid-shard: no completion record, a stray temp file
    (layout.tokens / "bbc" / "shard-00001.json").unlink()
    (layout.tokens / "bbc" / ".shard-00001.bin.tmp999").write_bytes(b"partial")
    r = run_tokenize(run, shard_index=1)
    assert r["shards_written"] == 1 and r["shards_reused"] == 0
    assert {p.name: p.read_bytes() for p in (layout.tokens / "bbc").glob("*.bin")} == before  # deterministic
    assert not list((layout.tokens / "bbc").glob(".*tmp*"))  # the dead attempt's temp file is gone
    # the cleaned input changed: its token shard is rebuilt
    src = corpus_shards(run)["bbc"][2]
    rows = list(read_shard(src))[:-5]
    write_shard(src, rows)
    mark_done(src, {"docs": len(rows)})
    r = run_tokenize(run)
    assert r["shards_written"] == 1 and r["shards_reused"] == 2
    m = json.loads((layout.tokens / "manifest.json").read_text())
    assert m["sources"]["bbc"]["shards"][2]["docs"] == len(rows)
    with pytest.raises(IndexError, match="out of range"):
        run_tokenize(run, shard_index=99)


def test_bad_rows_are_counted_not_fatal(tmp_path):
    cfg = tokenized_run(tmp_path, limit=20, per_shard=20)
    src = corpus_shards(cfg)["bbc"][0]
    rows = list(read_shard(src))
    rows += [{"id": "x1", "text": ""}, {"id": "x2", "text": None}, {"id": "x3", "text": "   \n"}]
    write_shard(src, rows)
    mark_done(src, {})
    run_tokenize(cfg)
    meta = json.loads((RunLayout(cfg).tokens / "bbc" / "shard-00000.json").read_text())
    assert meta["docs"] == 20 and meta["skipped"] == {"empty_text": 2, "no_tokens": 0, "bad_row": 1}


def test_dtype_and_overflow(tmp_path):
    assert smallest_dtype(50_265) == np.uint16 and smallest_dtype(65_536) == np.uint16
    assert smallest_dtype(65_537) == np.uint32
    w = TokenShardWriter(tmp_path / "s", np.uint16)
    with pytest.raises(ValueError, match="does not fit"):
        w.add("d", np.array([1, 70_000]))
    w.abort()
    assert not list(tmp_path.iterdir())


def test_pysbd_splitter_agrees_on_plain_sentences():
    text = "Title line\n\nFirst sentence here. Second one follows! A third?\nNew line."
    for kind in ("pysbd", "blingfire"):
        s = SentenceSplitter(kind).starts(text).tolist()
        assert [text[a:b].strip() for a, b in zip([0, *s], [*s, len(text)], strict=True)] == [
            "Title line",
            "First sentence here.",
            "Second one follows!",
            "A third?",
            "New line.",
        ]


def test_tiktoken_engine_is_used_and_exact(run, tmp_path):
    from data_pipeline.tokenizers.fast_bpe import TiktokenBPE

    layout = RunLayout(run)
    manifest = json.loads((layout.tokens / "manifest.json").read_text())
    assert manifest["engine"] == "tiktoken"
    assert {m["engine"] for m in manifest["sources"]["bbc"]["shards"]} == {"tiktoken"}
    fast = TiktokenBPE.load(layout.tokenizer / "tokenizer.json")
    tok = Tokenizer.from_file(str(layout.tokenizer / "tokenizer.json"))
    texts = ["A literal <mask> and </s> in text", "naïve café — 日本語 😀\n\n  x", "  lead", "tail  "]
    for t in texts:
        ref = tok.encode(t, add_special_tokens=False)
        if fast.needs_fallback(t):
            continue  # added-token text goes through `tokenizers` (checked below through the stage)
        ids = np.asarray(fast.encode_batch([t])[0])
        assert ids.tolist() == ref.ids
        assert fast.char_ends(ids).tolist() == [e for _, e in ref.offsets]
    assert fast.needs_fallback(texts[0])


def test_tiktoken_engine_refuses_inconsistent_or_other_tokenizers(tmp_path):
    from tokenizers import models, pre_tokenizers

    from data_pipeline.tokenizers import bpe_tokenizer
    from data_pipeline.tokenizers.fast_bpe import TiktokenBPE, rank_consistent

    # rule order b+c before a+b, then ab+c: rank-ordered merging would form "abc" where the rules cannot
    assert not rank_consistent(
        {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5},
        [(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")],
    )
    assert rank_consistent({b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"abc": 4}, [(b"a", b"b"), (b"ab", b"c")])
    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.save(str(tmp_path / "wp.json"))
    assert TiktokenBPE.load(tmp_path / "wp.json") is None
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    n = len(vocab)
    vocab.update({"bc": n, "ab": n + 1, "abc": n + 2})
    bad = bpe_tokenizer(vocab, [("b", "c"), ("a", "b"), ("ab", "c")])
    bad.save(str(tmp_path / "bad.json"))
    assert TiktokenBPE.load(tmp_path / "bad.json") is None  # `tokenizers` keeps the job: ids stay exact


def test_added_token_text_falls_back_exactly(tmp_path):
    cfg = tokenized_run(tmp_path, limit=20, per_shard=20)
    src = corpus_shards(cfg)["bbc"][0]
    rows = list(read_shard(src))
    rows[3]["text"] = "We write <mask> and <s> literally. " + rows[3]["text"]
    write_shard(src, rows)
    mark_done(src, {})
    run_tokenize(cfg)
    layout = RunLayout(cfg)
    tok = Tokenizer.from_file(str(layout.tokenizer / "tokenizer.json"))
    _, shards = open_token_shards(str(layout.tokens))
    for i in (2, 3):
        assert shards["bbc"][0].doc(i).tolist() == tok.encode(rows[i]["text"], add_special_tokens=False).ids
    assert tok.token_to_id("<mask>") in shards["bbc"][0].doc(3).tolist()


def test_corrupt_input_shard_is_a_clear_error(tmp_path):
    import zstandard

    cfg = tokenized_run(tmp_path, limit=10, per_shard=10)
    src = corpus_shards(cfg)["bbc"][0]
    src.write_bytes(zstandard.ZstdCompressor().compress(b'{"id": "a", "text": "fine"}\n{not json\n'))
    # checked against its marker before any work (issue 25 item 2): the file and the stage to rerun named
    with pytest.raises(ShardMismatchError, match=r"shard-00000.jsonl.zst: .* bytes .*data_pipeline clean"):
        run_tokenize(cfg)
    assert not list((RunLayout(cfg).tokens / "bbc").glob(".*tmp*"))
