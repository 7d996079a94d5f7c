"""Global dedup stage over all cleaned shards: exact (normalised-content hash) then MinHash-LSH near-dedup.

Steps: per-shard signatures (parallel, cached under dedup/_work with markers) -> LSH buckets over the whole
corpus -> clusters (union-find) -> one document kept per cluster (the earliest in corpus order, so the
result does not depend on worker timing) -> dedup/<source>/shard-XXXXX written atomically + dedup_stats.json.
See minhash.py for the expected precision/recall of the (bands, rows) choice.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.dedup.exact import content_hash
from data_pipeline.dedup.minhash import MinHasher, UnionFind, expected_collision_probability, lsh_pairs
from data_pipeline.layout import RunLayout
from data_pipeline.shards import (
    DEDUP_DONE,
    _source_shards,
    mark_done,
    read_shard,
    write_json_atomic,
    write_shard,
)

__all__ = ["run_dedup", "MinHasher", "content_hash", "expected_collision_probability"]


def _fingerprint(cfg) -> str:
    return hashlib.sha256(json.dumps(cfg.data.dedup.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def _sig_job(args: tuple) -> str:
    shard, out, mh_kw, use_minhash, fp = args
    out = Path(out)
    stamp = f"{fp}:{Path(shard).stat().st_size}:{Path(shard).stat().st_mtime_ns}"
    done = out.with_suffix(".done")
    if done.exists() and out.exists() and done.read_text() == stamp:
        return str(out)
    mh = MinHasher(**mh_kw)
    ids, hashes, sigs = [], [], []
    for row in read_shard(shard):
        ids.append(row["id"])
        hashes.append(content_hash(row["text"]))
        if use_minhash:
            sigs.append(mh.signature(row["text"]))
    sig_arr = np.stack(sigs) if sigs else np.zeros((len(ids), mh.num_perm if use_minhash else 0), np.uint32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, ids=np.array(ids, dtype=object), hashes=np.array(hashes, dtype=np.int64), sigs=sig_arr)
    tmp.replace(out)
    done.write_text(stamp)
    return str(out)


def run_dedup(cfg) -> dict[str, Any]:
    """Deduplicate the cleaned corpus into dedup/; returns the summary written to dedup/dedup_stats.json."""
    t0 = time.time()
    layout = RunLayout(cfg)
    dd = cfg.data.dedup
    clean_stats = layout.clean / "stats.json"
    if not clean_stats.exists() or not json.loads(clean_stats.read_text()).get("complete"):
        raise RuntimeError(f"dedup: the clean stage is not complete (see {clean_stats}); run `clean` first")
    shards = _source_shards(layout.clean, [s.name for s in cfg.data.sources])
    order = [(src, i, p) for src, files in shards.items() for i, p in enumerate(files)]
    fp = _fingerprint(cfg)
    mh_kw = {"ngram": dd.minhash.ngram, "bands": dd.minhash.bands, "rows": dd.minhash.rows, "seed": dd.minhash.seed}
    jobs = [(str(p), str(layout.dedup / "_work" / src / (p.name.split(".")[0] + ".npz")), mh_kw,
             dd.minhash.enabled, fp) for src, _, p in order]
    workers = min(cfg.data.clean.workers, len(jobs))
    if workers > 1:
        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            sig_files = list(pool.map(_sig_job, jobs))
    else:
        sig_files = [_sig_job(j) for j in jobs]
    t_sig = time.time() - t0

    loaded = [np.load(f, allow_pickle=True) for f in sig_files]
    counts = [len(x["ids"]) for x in loaded]
    n = sum(counts)
    ids = np.concatenate([x["ids"] for x in loaded]) if n else np.zeros(0, dtype=object)
    hashes = np.concatenate([x["hashes"] for x in loaded]) if n else np.zeros(0, np.int64)
    keep = np.ones(n, dtype=bool)
    reason = np.zeros(n, dtype=np.int8)  # 0 kept, 1 exact duplicate, 2 near duplicate
    if dd.exact and n:
        _, first = np.unique(hashes, return_index=True)
        mask = np.zeros(n, bool)
        mask[first] = True
        reason[~mask] = 1
        keep &= mask
    clusters_examples: list[list[str]] = []
    n_pairs = 0
    if dd.minhash.enabled and n:
        mh = MinHasher(**mh_kw)
        alive = np.nonzero(keep)[0]
        sigs = np.concatenate([x["sigs"] for x in loaded])[alive]
        pairs = lsh_pairs(mh.band_keys(sigs))
        n_pairs = len(pairs)
        uf = UnionFind(len(alive))
        for a, b in pairs:
            uf.union(int(a), int(b))
        roots = np.array([uf.find(i) for i in range(len(alive))])
        dup = roots != np.arange(len(alive))
        reason[alive[dup]] = 2
        keep[alive[dup]] = False
        for r in np.unique(roots[dup])[:5]:
            clusters_examples.append([str(ids[alive[i]]) for i in np.nonzero(roots == r)[0][:5]])

    # Write the surviving rows shard by shard (same names as clean/), atomically, with markers.
    per_source: dict[str, dict[str, int]] = {}
    pos = 0
    for (src, _, path), cnt in zip(order, counts, strict=True):
        k = keep[pos : pos + cnt]
        r = reason[pos : pos + cnt]
        out = layout.dedup / src / path.name
        rows = (row for row, kk in zip(read_shard(path), k, strict=True) if kk)
        kept = write_shard(out, rows)
        mark_done(out, {"kept": kept, "input": str(path)})
        s = per_source.setdefault(src, {"docs_in": 0, "kept": 0, "exact_duplicates": 0, "near_duplicates": 0})
        s["docs_in"] += cnt
        s["kept"] += kept
        s["exact_duplicates"] += int((r == 1).sum())
        s["near_duplicates"] += int((r == 2).sum())
        pos += cnt
    b, rr = dd.minhash.bands, dd.minhash.rows
    stats = {
        "docs_in": n,
        "kept": int(keep.sum()),
        "exact_duplicates": int((reason == 1).sum()),
        "near_duplicates": int((reason == 2).sum()),
        "candidate_pairs": n_pairs,
        "per_source": per_source,
        "near_duplicate_cluster_examples": clusters_examples,
        "minhash": {**mh_kw, "threshold": round((1 / b) ** (1 / rr), 3),
                    "P(candidate|s)": {str(s): round(expected_collision_probability(s, b, rr), 4)
                                       for s in (0.5, 0.7, 0.8, 0.9)}},
        "seconds_signatures": round(t_sig, 2),
        "seconds": round(time.time() - t0, 2),
    }
    write_json_atomic(layout.dedup / "dedup_stats.json", stats)
    write_json_atomic(layout.dedup / DEDUP_DONE, {"fingerprint": fp, "kept": stats["kept"]})
    return stats
