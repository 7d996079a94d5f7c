"""The whole data path on real text: BBC -> cleaned-shard rows -> tokenizer -> token shards -> loader -> collator."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoTokenizer

from core.run_layout import RunLayout
from data_pipeline.loader import PretrainLoader
from data_pipeline.objectives import build_collator
from data_pipeline.tokenize import run_tokenize
from data_pipeline.tokenizers import train_tokenizer
from tests.data_pipeline.tokens_fixtures import bbc_config


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_bbc_bpe8000_full_sentences_two_ranks(tmp_path):
    cfg = bbc_config(
        tmp_path, "roberta-tiny", ["tokenizer.vocab_size=8000", "loader.num_workers=1"], per_shard=400
    )
    t0 = time.perf_counter()
    path = train_tokenizer(cfg)
    t1 = time.perf_counter()
    summary = run_tokenize(cfg)
    t2 = time.perf_counter()
    print(f"train-tokenizer {t1 - t0:.1f}s, tokenize {t2 - t1:.1f}s, {summary['totals']}")
    assert (
        summary["totals"]["docs"] > 1500
        and summary["totals"]["sentences"] > 20 * summary["totals"]["docs"] / 2
    )
    assert t2 - t0 < 60  # demo scale stays in seconds (generous bound for a loaded 2-core machine)
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 8000
    collate = build_collator(cfg, tok)
    ranks = [PretrainLoader(cfg, r, 2, collate_fn=collate) for r in range(2)]
    seen = set()
    for ld in ranks:
        it = iter(ld)
        for _ in range(ld.grad_accum * 3):
            b = next(it)
            assert b["input_ids"].shape == (8, 128) and b["labels"].shape == (8, 128)
            assert (b["input_ids"][:, 0] == tok.bos_token_id).all()
            masked = b["labels"] != -100
            assert 0.05 < masked[b["attention_mask"].bool()].float().mean() < 0.3
            seen |= set(b["input_ids"][:, 1:4].flatten().tolist())
        assert ld.state_dict()["consumed_samples"] == 3 * 32
    assert len(seen) > 100
    text = tok.decode(ranks[0].sources[0][5]["input_ids"], skip_special_tokens=True)
    assert len(text.split()) > 50 and " the " in text


@pytest.mark.parametrize("preset", ["gpt2-tiny", "t5-tiny"])
def test_other_families_feed_their_collators(tmp_path, preset):
    cfg = bbc_config(
        tmp_path, preset, ["tokenizer.vocab_size=1500", "loader.num_workers=0"], limit=150, per_shard=75
    )
    train_tokenizer(cfg)
    run_tokenize(cfg)
    tok = AutoTokenizer.from_pretrained(RunLayout(cfg).tokenizer)
    ld = PretrainLoader(cfg, 1, 2, collate_fn=build_collator(cfg, tok))
    b = next(iter(ld))
    assert b["input_ids"].shape == (8, 128)
    if preset == "t5-tiny":
        assert ld.tokens_per_sample == 141 and b["labels"].shape == (8, 29)
        assert (b["input_ids"] >= len(tok) - 100).any()  # sentinels present
    else:
        assert torch.equal(b["labels"], b["input_ids"]) or (b["labels"] == -100).any()
