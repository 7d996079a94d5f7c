"""Packing modes: exact coverage of the stream, framing, sentence boundaries, padding (synthetic + real BBC)."""

from __future__ import annotations

import numpy as np
import pytest

from core.run_layout import RunLayout
from data_pipeline.objectives.t5_lengths import t5_lengths
from data_pipeline.packing import PackedSource
from data_pipeline.token_shards import TokenShard, TokenShardWriter, open_token_shards
from tests.data_pipeline.tokens_fixtures import tokenized_run

SPECIAL = {"bos": 0, "pad": 1, "eos": 2, "sep": 2, "unk": 3, "mask": 4}


def synthetic(tmp_path, docs: list[list[list[int]]]) -> list[TokenShard]:
    """docs = [[sentence tokens, ...], ...] split over two shards; token values >= 10 (never special)."""
    shards = []
    for k, part in enumerate((docs[: len(docs) // 2], docs[len(docs) // 2 :])):
        w = TokenShardWriter(tmp_path / f"shard-{k}", np.uint16)
        for d, sents in enumerate(part):
            lens = np.cumsum([len(s) for s in sents])[:-1]
            w.add(f"d{k}{d}", np.concatenate([np.asarray(s) for s in sents]), lens)
        meta = w.close()
        shards.append(TokenShard(tmp_path / meta["bin"], tmp_path / meta["idx"], meta["dtype"]))
    return shards


@pytest.fixture
def docs():
    rng = np.random.default_rng(0)
    out, v = [], 10
    for _ in range(12):
        sents = []
        for _ in range(rng.integers(1, 6)):
            n = int(rng.integers(1, 14))
            sents.append(list(range(v, v + n)))
            v += n
        out.append(sents)
    out[3].insert(1, list(range(v, v + 45)))  # a sentence longer than any block below
    return out


def stream_of(docs, sep):
    out = []
    for sents in docs:
        out += [t for s in sents for t in s] + ([sep] if sep is not None else [])
    return out


def test_full_sentences_fill_covers_stream_with_separators(tmp_path, docs):
    ps = PackedSource(synthetic(tmp_path, docs), SPECIAL, "full_sentences", 16, "mlm", "fill")
    body = []
    for i in range(len(ps)):
        x = ps[i]["input_ids"]
        assert x.shape == (16,) and x[0] == 0
        real = x[x != 1]
        assert real[-1] == 2
        if i < len(ps) - 1:
            assert (x != 1).all()  # padding only in the last block
        body += real[1:-1].tolist()
    assert body == stream_of(docs, 2)
    assert ps.stats()["pad_tokens"] == 16 * len(ps) - len(body) - 2 * len(ps)


def test_full_sentences_complete_ends_on_sentences_and_splits_long_ones(tmp_path, docs):
    ps = PackedSource(synthetic(tmp_path, docs), SPECIAL, "full_sentences", 16, "mlm", "complete")
    # sentence ends in stream coordinates (the document separator belongs to the document's last sentence)
    ends, pos = set(), 0
    for sents in docs:
        for k, s in enumerate(sents):
            pos += len(s) + (k == len(sents) - 1)
            ends.add(pos)
    body = []
    for i in range(len(ps)):
        a, b = int(ps.starts[i]), int(ps.ends[i])
        assert b in ends or b - a == 14  # whole sentences, or a cut of an over-long sentence
        x = ps[i]["input_ids"]
        real = x[x != 1]
        assert x[0] == 0 and real[-1] == 2 and len(x) == 16
        body += real[1:-1].tolist()
    assert body == stream_of(docs, 2)  # nothing dropped, nothing repeated, order kept
    assert any(int(e - s) == 14 for s, e in zip(ps.starts, ps.ends, strict=True))


def test_contiguous_blocks_eos_and_segments(tmp_path, docs):
    ps = PackedSource(synthetic(tmp_path, docs), SPECIAL, "contiguous", 10, "causal")
    stream = stream_of(docs, 2)
    assert len(ps) == len(stream) // 10 and ps.stats()["pad_tokens"] == 0
    for i in range(len(ps)):
        x = ps[i]
        assert x["input_ids"].tolist() == stream[i * 10 : (i + 1) * 10]
        seg = x["segment_ids"]
        assert seg[0] == 0 and (np.diff(seg) >= 0).all()
        # a new segment starts right after each EOS
        eos = np.flatnonzero(x["input_ids"][:-1] == 2)
        assert (seg[eos + 1] == seg[eos] + 1).all() and len(np.unique(seg)) == len(eos) + 1


def test_t5_spans_block_length(tmp_path, docs):
    ps = PackedSource(synthetic(tmp_path, docs), SPECIAL, "t5_spans", 16, "span_corruption")
    raw, _ = t5_lengths(16, 0.15, 3.0)
    stream = stream_of(docs, None)
    assert ps.tokens_per_sample == raw and len(ps) == len(stream) // raw
    assert all(ps[i]["input_ids"].tolist() == stream[i * raw : (i + 1) * raw] for i in range(len(ps)))


def test_line_by_line_one_document_per_sample(tmp_path, docs):
    ps = PackedSource(synthetic(tmp_path, docs), SPECIAL, "line_by_line", 16, "mlm")
    got = [ps[i]["input_ids"] for i in range(len(ps))]
    assert all(g[0] == 0 and g[-1] == 2 and len(g) <= 16 for g in got)
    assert [t for g in got for t in g[1:-1].tolist()] == stream_of(docs, None)
    causal = PackedSource(ps.stream.shards, SPECIAL, "line_by_line", 16, "causal")
    assert all(causal[i]["input_ids"][-1] == 2 and causal[i]["input_ids"][0] != 0 for i in range(len(causal)))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return tokenized_run(tmp_path_factory.mktemp("real"), limit=300, per_shard=150)


@pytest.mark.parametrize("seq_len", [128, 512])
def test_padding_on_real_text(real, seq_len):
    cfg = real
    manifest, shards = open_token_shards(str(RunLayout(cfg).tokens))
    for mode, obj in [("full_sentences", "mlm"), ("contiguous", "causal"), ("t5_spans", "span_corruption")]:
        st = PackedSource(shards["bbc"], manifest["special_ids"], mode, seq_len, obj, "fill").stats()
        assert st["padding_fraction"] <= 0.01, (mode, st)
        assert st["unused_tail_tokens"] < seq_len + 100
    st = PackedSource(
        shards["bbc"], manifest["special_ids"], "full_sentences", seq_len, "mlm", "complete"
    ).stats()
    assert 0 < st["padding_fraction"] < 0.2  # paper-style sentence breaks pay in padding; reported honestly


def test_best_fit_whole_sentences_fill_gaps_from_next_documents(tmp_path, docs):
    shards = synthetic(tmp_path, docs)
    ps = PackedSource(shards, SPECIAL, "full_sentences", 24, "mlm", "best_fit")
    assert ps.sentence_break == "best_fit"
    # sentence boundaries in stream coordinates (the 45-token sentence is cut into 22-token pieces)
    bounds, pos = {0}, 0
    for sents in docs:
        for k, s in enumerate(sents):
            for cut in range(22, len(s), 22):
                bounds.add(pos + cut)
            pos += len(s) + (k == len(sents) - 1)
            bounds.add(pos)
    covered = []
    for i in range(len(ps)):
        x = ps[i]["input_ids"]
        assert len(x) == 24 and x[0] == 0
        for k in range(ps.seg_ptr[i], ps.seg_ptr[i + 1]):
            a, b = int(ps.seg_a[k]), int(ps.seg_b[k])
            assert a in bounds and b in bounds  # whole sentences only
            covered += range(a, b)
    assert sorted(covered) == list(range(len(stream_of(docs, 2))))  # every token once, none dropped
    assert ps.seg_sep.any()  # some gaps were filled from another document, marked by a separator
    # token content: each block's segments read back as the stream slices, with </s> at switches
    stream = stream_of(docs, 2)
    i = int(np.flatnonzero(np.diff(ps.seg_ptr) > 1)[0])
    want = []
    for k in range(ps.seg_ptr[i], ps.seg_ptr[i + 1]):
        want += ([2] if ps.seg_sep[k] else []) + stream[ps.seg_a[k] : ps.seg_b[k]]
    x = ps[i]["input_ids"]
    assert x[x != 1].tolist() == [0, *want, 2]


def test_auto_sentence_break_and_index_cache(real, tmp_path):
    manifest, shards = open_token_shards(str(RunLayout(real).tokens))
    big = PackedSource(
        shards["bbc"],
        manifest["special_ids"],
        "full_sentences",
        512,
        "mlm",
        "auto",
        cache=tmp_path / "i512.npz",
    )
    small = PackedSource(shards["bbc"], manifest["special_ids"], "full_sentences", 128, "mlm", "auto")
    assert big.sentence_break == "best_fit" and big.stats()["padding_fraction"] <= 0.01
    assert small.sentence_break == "fill" and small.stats()["padding_fraction"] <= 0.01
    again = PackedSource(
        shards["bbc"],
        manifest["special_ids"],
        "full_sentences",
        512,
        "mlm",
        "auto",
        cache=tmp_path / "i512.npz",
    )
    assert (tmp_path / "i512.npz").is_file() and np.array_equal(again.seg_a, big.seg_a)
    assert all(np.array_equal(again[i]["input_ids"], big[i]["input_ids"]) for i in range(0, len(big), 97))


def test_index_cache_written_by_tokenize_is_found_by_the_loader(real):
    """run_tokenize builds the sentence-aligned index from its in-memory manifest; the loader looks it up with the
    manifest read back from disk (JSON with sorted keys). Both must name the same cache file, or every rank
    recomputes the index at start-up."""
    import json

    from data_pipeline.packing import index_cache_path
    from data_pipeline.token_shards import MANIFEST

    cfg = real.model_copy(deep=True)
    cfg.packing.sentence_break = "best_fit"
    on_disk = json.loads((RunLayout(cfg).tokens / MANIFEST).read_text())
    in_memory = {**on_disk, "special_ids": dict(reversed(list(on_disk["special_ids"].items())))}
    where = RunLayout(cfg).tokens / "pack-index"
    assert index_cache_path(cfg, in_memory, "bbc", where) == index_cache_path(cfg, on_disk, "bbc", where)
