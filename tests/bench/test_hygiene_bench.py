"""bench/hygiene_vs_datatrove.py without datatrove: its synthetic set plants every kind of item, our filters catch
each one, and the check fails when a filter is missing what it should catch."""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import hygiene_vs_datatrove as hb  # noqa: E402


def test_every_planted_item_is_caught_and_a_weaker_filter_misses_some(tmp_path):
    articles = hb.CV.bbc_articles()[:300]
    eval_ids = set(range(0, len(articles), 15))
    syn, planted = hb.synthetic(articles, eval_ids, random.Random(0), n=200)
    hb.write_lists(tmp_path)
    steps = hb.our_steps(tmp_path, [articles[i] for i in sorted(eval_ids)])
    caught, total = hb.planted_caught(syn, planted, steps, eval_ids)
    kinds = {"eval_ngram", "blocked_url", "email", "ipv4", "ipv4_reserved", "ipv6", "ipv6_reserved", "phone"}
    assert set(total) == kinds and all(total[k] >= 2 for k in kinds), total
    assert caught == total
    # the same check with a listed subdomain left out and 500-grams (longer than any planted paragraph): it fails
    (tmp_path / "blocked_domains.txt").write_text("blocked-casino.com\n")
    weaker = hb.our_steps(tmp_path, [articles[i] for i in sorted(eval_ids)], n=500)
    missed, _ = hb.planted_caught(syn, planted, weaker, eval_ids)
    assert missed["blocked_url"] < total["blocked_url"] and missed["eval_ngram"] == 0
