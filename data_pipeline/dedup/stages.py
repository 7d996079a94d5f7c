"""Sharded exact + MinHash-LSH dedup as five stages of independent, restartable tasks.

Documents are named by a 64-bit gid = (input shard ordinal << 32) | row, so gid order is corpus order.
S = cleaned shards, B = bands, R = hash-range partitions (`data.dedup.partitions`, or documents /
`docs_per_partition`), F = `merge_fan_in`. Everything lives under dedup/_work/<fingerprint>/, so outputs of
another config or another cleaned corpus never mix with these.

1. signatures (S tasks)   shard s -> sig/s<s>-r<r>.npz for each range r: per band b the (band key, gid) pairs
                           whose key falls in range r, and the (content hash, gid) pairs in range r.
                           Memory: one shard (4 bytes x B x rows per document).
2. buckets (B*R + R tasks) task (b, r) loads band b of range r from every shard, sorts by key and emits an edge
                           (first gid, gid) for every later document of a shared bucket; the last R tasks do
                           the same with content hashes (exact dedup, partitioned by hash the same way).
                           Memory: 16 bytes x documents in the range (~ corpus / R): bounded by the partition.
3. components-L0..Lk      union-find (vectorised min-label propagation) over F edge files -> a star forest
                           (root, member) per connected component, written as the next level's input; repeated
                           until one task is left, which also writes remove/s<s>.npz (rows to drop, reason) for
                           every shard. Memory: 16 bytes x duplicate documents in the task's inputs: edges only
                           name documents that have a duplicate, so this is bounded by the number of
                           duplicates, never by the number of documents.
4. filter (S tasks)       shard s minus its removed rows -> dedup/<source>/<shard name>, with its marker.
                           Memory: one shard's removal list; rows are streamed.

The kept document of a cluster is its smallest gid, i.e. the earliest in corpus order (source order, then shard,
then row), independent of task timing, partitioning and executor. Every task writes its files atomically and
then its marker; a rerun does only the tasks without one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.dedup.exact import content_hash
from data_pipeline.dedup.minhash import MinHasher, expected_collision_probability
from data_pipeline.executors import Stage
from data_pipeline.layout import RunLayout
from data_pipeline.shards import (
    DEDUP_DONE,
    _atomic_write_bytes,
    mark_done,
    read_shard,
    shard_name,
    write_json_atomic,
    write_shard,
)

EXACT, NEAR = 1, 2


# -- plan ------------------------------------------------------------------------------------------------------


def _clean_inputs(cfg) -> list[Path]:
    """Every cleaned shard the finished clean stage says exists, in corpus order.

    Taken from the clean report (not from listing the folder), so a shard that vanished is an error naming it
    rather than a silently smaller corpus.
    """
    layout = RunLayout(cfg)
    stats_path = layout.clean / "stats.json"
    try:
        stats = json.loads(stats_path.read_text())
    except (OSError, ValueError):
        stats = {}
    if not stats.get("complete"):
        raise RuntimeError(f"dedup: the clean stage is not complete (see {stats_path}); run `clean` first")
    fmt = cfg.data.clean.output_format
    out = []
    for src in cfg.data.sources:
        n = stats.get("per_source", {}).get(src.name, {}).get("shards", 0)
        out += [layout.clean / src.name / shard_name(i, fmt) for i in range(n)]
    return out


def num_partitions(cfg, docs: int) -> int:
    dd = cfg.data.dedup
    return dd.partitions or max(1, math.ceil(docs / dd.docs_per_partition))


def _fingerprint(cfg, inputs: list[Path], ranges: int) -> str:
    files = []
    for p in inputs:
        try:
            st = p.stat()
            files.append([f"{p.parent.name}/{p.name}", st.st_size, st.st_mtime_ns])  # the same on every node
        except OSError:
            files.append([f"{p.parent.name}/{p.name}", None, None])  # vanished: the signatures task for it reports it
    blob = {"dedup": cfg.data.dedup.model_dump(mode="json"), "ranges": ranges, "inputs": files}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def stage_shapes(num_inputs: int, ranges: int, bands: int, fan_in: int, minhash: bool, exact: bool
                 ) -> list[tuple[str, int]]:
    """[(stage name, tasks)]: what a Slurm pipeline renders before the corpus exists."""
    n_edges = (bands * ranges if minhash else 0) + (ranges if exact else 0)
    shapes = [("dedup-signatures", num_inputs)]
    if n_edges:
        shapes.append(("dedup-buckets", n_edges))
    level, n = 0, n_edges
    while True:
        tasks = max(1, math.ceil(n / fan_in))
        shapes.append((f"dedup-components-L{level}", tasks))
        if tasks == 1:
            break
        level, n = level + 1, tasks
    shapes.append(("dedup-filter", num_inputs))
    return shapes


def plan_shapes(cfg, num_inputs: int, ranges: int) -> list[tuple[str, int]]:
    dd = cfg.data.dedup
    return stage_shapes(num_inputs, ranges, dd.minhash.bands, dd.merge_fan_in, dd.minhash.enabled, dd.exact)


def build_stages(cfg) -> list[Stage]:
    """The dedup stages of this run, in order (needs the finished clean stage)."""
    layout = RunLayout(cfg)
    layout.store.pull([layout.clean])  # a remote run: the cleaned shards, wherever they were written
    dd = cfg.data.dedup
    inputs = _clean_inputs(cfg)
    docs = json.loads((layout.clean / "stats.json").read_text()).get("totals", {}).get("kept", 0)
    R = num_partitions(cfg, docs)
    fp = _fingerprint(cfg, inputs, R)
    work = layout.dedup / "_work" / fp
    marks = work / "markers"
    # a remote run: every task uploads what it wrote under dedup/ before its marker (storage.py)
    new_stage = functools.partial(Stage, store=layout.store, outputs=(str(work), str(layout.dedup)), exclude=("_work",))
    B = dd.minhash.bands
    mh_kw = {"ngram": dd.minhash.ngram, "bands": B, "rows": dd.minhash.rows, "seed": dd.minhash.seed}
    names = tuple(f"{p.parent.name}/{p.name}" for p in inputs)
    shapes = dict(plan_shapes(cfg, len(inputs), R))
    S = len(inputs)
    stages = [new_stage("dedup-signatures", signature_task, S, marks, labels=names,
                    kwargs={"inputs": [str(p) for p in inputs], "work": str(work), "ranges": R, "mh_kw": mh_kw,
                            "minhash": dd.minhash.enabled, "exact": dd.exact})]
    edge_files: list[str] = []
    if "dedup-buckets" in shapes:
        jobs = ([("b", b, r) for b in range(B) for r in range(R)] if dd.minhash.enabled else []) + \
               ([("x", 0, r) for r in range(R)] if dd.exact else [])
        edge_files = [str(work / "pairs" / (f"b{b:03d}-r{r:04d}.npy" if k == "b" else f"x-r{r:04d}.npy"))
                      for k, b, r in jobs]
        stages.append(new_stage("dedup-buckets", bucket_task, len(jobs), marks,
                            labels=tuple(f"band {b} range {r}" if k == "b" else f"exact range {r}"
                                         for k, b, r in jobs),
                            kwargs={"jobs": jobs, "work": str(work), "num_inputs": S}))
    level_inputs = edge_files
    level = 0
    while f"dedup-components-L{level}" in shapes:
        n = shapes[f"dedup-components-L{level}"]
        last = n == 1
        outs = [str(work / "cc" / f"L{level}-{j:05d}.npy") for j in range(n)]
        stages.append(new_stage(f"dedup-components-L{level}", components_task, n, marks,
                            kwargs={"inputs": level_inputs, "outputs": outs, "fan_in": dd.merge_fan_in,
                                    "final": last, "work": str(work), "shard_names": names,
                                    "exact_files": [str(work / "pairs" / f"xdup-r{r:04d}.npy") for r in range(R)]
                                    if dd.exact else []}))
        level_inputs, level = outs, level + 1
    shapes_list = [(st.name, st.num_tasks) for st in stages] + [("dedup-filter", S)]
    stages.append(new_stage("dedup-filter", filter_task, S, marks, labels=names,
                        kwargs={"inputs": [str(p) for p in inputs], "work": str(work),
                                "out_root": str(layout.dedup)},
                        finalize=functools.partial(finalize, str(layout.dedup), fp, mh_kw, R, str(marks),
                                                   shapes_list, S)))
    return stages


# -- tasks -----------------------------------------------------------------------------------------------------


def _save_npy(path: Path, arr: np.ndarray) -> None:
    _atomic_write_bytes(Path(path), lambda f: np.save(f, arr))


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    _atomic_write_bytes(Path(path), lambda f: np.savez(f, **arrays))


def _range_of(keys: np.ndarray, ranges: int) -> np.ndarray:
    """Hash range of a uint64 key: the top 32 bits scaled to [0, ranges) (ranges < 2^32, no overflow)."""
    return ((keys >> np.uint64(32)) * np.uint64(ranges)) >> np.uint64(32)


def signature_task(i: int, *, inputs: list[str], work: str, ranges: int, mh_kw: dict, minhash: bool,
                   exact: bool) -> dict[str, Any]:
    path = inputs[i]
    mh = MinHasher(**mh_kw)
    hashes, sigs = [], []
    for row in read_shard(path):  # a vanished or corrupt shard raises here, naming the file
        text = row["text"]
        if exact:
            hashes.append(content_hash(text))
        if minhash:
            sigs.append(mh.signature(text))
    n = max(len(hashes), len(sigs))
    if n >= 1 << 32:
        raise ValueError(f"{path}: {n} rows; a shard must hold fewer than 2^32 documents")
    gids = (np.uint64(i) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
    keys = mh.band_keys(np.stack(sigs)) if minhash and n else np.zeros((n, mh.bands), np.uint64)
    key_rng = _range_of(keys, ranges)
    h = np.array(hashes, dtype=np.int64).view(np.uint64) if exact else np.zeros(0, np.uint64)
    h_rng = _range_of(h, ranges)
    for r in range(ranges):
        members: dict[str, np.ndarray] = {}
        if minhash:
            for b in range(mh.bands):
                sel = key_rng[:, b] == r
                members[f"b{b}"] = np.stack([keys[sel, b], gids[sel]], axis=1)
        if exact:
            sel = h_rng == r
            members["exact"] = np.stack([h[sel], gids[sel]], axis=1)
        _save_npz(Path(work) / "sig" / f"s{i:05d}-r{r:04d}.npz", **members)
    return {"docs": n}


def _bucket_edges(pairs: np.ndarray) -> np.ndarray:
    """[(first gid, gid)] for every document that shares its key with an earlier one (rows: key, gid)."""
    if len(pairs) < 2:
        return np.zeros((0, 2), np.uint64)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    k, g = pairs[order, 0], pairs[order, 1]
    start = np.ones(len(k), bool)
    start[1:] = k[1:] != k[:-1]
    first = np.maximum.accumulate(np.where(start, np.arange(len(k)), 0))
    dup = ~start
    return np.stack([g[first[dup]], g[dup]], axis=1)


def bucket_task(i: int, *, jobs: list[tuple[str, int, int]], work: str, num_inputs: int) -> dict[str, Any]:
    kind, b, r = jobs[i]
    member = f"b{b}" if kind == "b" else "exact"
    parts = []
    for s in range(num_inputs):
        f = Path(work) / "sig" / f"s{s:05d}-r{r:04d}.npz"
        with np.load(f) as z:  # a missing file raises FileNotFoundError naming it
            parts.append(z[member])
    pairs = np.concatenate(parts) if parts else np.zeros((0, 2), np.uint64)
    edges = _bucket_edges(pairs)
    if kind == "b":
        _save_npy(Path(work) / "pairs" / f"b{b:03d}-r{r:04d}.npy", edges)
    else:
        _save_npy(Path(work) / "pairs" / f"xdup-r{r:04d}.npy", np.unique(edges[:, 1]))
        _save_npy(Path(work) / "pairs" / f"x-r{r:04d}.npy", edges)
    return {"kind": "near" if kind == "b" else "exact", "docs": int(len(pairs)), "pairs": int(len(edges))}


def star_forest(edges: np.ndarray) -> np.ndarray:
    """Connected components of an edge list as [(root, member)] with root = the component's smallest gid.

    Vectorised min-label propagation with pointer jumping (numpy has no union-find; scipy is not a
    dependency): each round every edge pulls both ends to the smaller label, then labels jump to their
    label's label until stable. Star-shaped bucket edges converge in a few rounds.
    """
    if len(edges) == 0:
        return np.zeros((0, 2), np.uint64)
    nodes, inv = np.unique(edges.ravel(), return_inverse=True)
    u, v = inv.reshape(-1, 2).T
    label = np.arange(len(nodes))
    while True:
        m = np.minimum(label[u], label[v])
        new = label.copy()
        np.minimum.at(new, u, m)
        np.minimum.at(new, v, m)
        while True:
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            break
        label = new
    member = label != np.arange(len(nodes))
    return np.stack([nodes[label[member]], nodes[member]], axis=1)


def components_task(i: int, *, inputs: list[str], outputs: list[str], fan_in: int, final: bool, work: str,
                    shard_names: tuple[str, ...], exact_files: list[str]) -> dict[str, Any]:
    mine = inputs[i * fan_in:(i + 1) * fan_in]
    parts = [np.load(f) for f in mine]
    edges = np.concatenate(parts) if parts else np.zeros((0, 2), np.uint64)
    forest = star_forest(edges.astype(np.uint64, copy=False))
    _save_npy(Path(outputs[i]), forest)
    stats: dict[str, Any] = {"edges_in": int(len(edges)), "members": int(len(forest)),
                             "clusters": int(len(np.unique(forest[:, 0]))) if len(forest) else 0}
    if final:
        stats.update(_write_removals(forest, work, shard_names, exact_files))
    return stats


def _write_removals(forest: np.ndarray, work: str, shard_names: tuple[str, ...], exact_files: list[str]
                    ) -> dict[str, Any]:
    """remove/s<s>.npz for every shard (rows to drop, 1 = exact copy, 2 = near copy), even when empty: the
    filter task of a shard without its file fails instead of keeping everything."""
    exact_dups = np.unique(np.concatenate([np.load(f) for f in exact_files])) if exact_files else \
        np.zeros(0, np.uint64)
    members = np.sort(forest[:, 1]) if len(forest) else np.zeros(0, np.uint64)
    reason = np.where(np.isin(members, exact_dups), EXACT, NEAR).astype(np.int8)
    shard = (members >> np.uint64(32)).astype(np.int64)
    rows = (members & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    bounds = np.searchsorted(shard, np.arange(len(shard_names) + 1))
    for s in range(len(shard_names)):
        lo, hi = bounds[s], bounds[s + 1]
        _save_npz(Path(work) / "remove" / f"s{s:05d}.npz", rows=rows[lo:hi], reason=reason[lo:hi])
    examples = []
    if len(forest):
        near_roots = np.unique(forest[np.isin(forest[:, 1], exact_dups, invert=True), 0])[:5]
        for root in near_roots:
            ids = [root, *forest[forest[:, 0] == root, 1][:4]]
            examples.append([f"{shard_names[int(g) >> 32]}#{int(g) & 0xFFFFFFFF}" for g in ids])
    return {"cluster_examples": examples}


def filter_task(i: int, *, inputs: list[str], work: str, out_root: str) -> dict[str, Any]:
    src_path = Path(inputs[i])
    with np.load(Path(work) / "remove" / f"s{i:05d}.npz") as z:
        rows, reason = z["rows"], z["reason"]
    drop = set(rows.tolist())
    out = Path(out_root) / src_path.parent.name / src_path.name
    n = 0

    def kept():
        nonlocal n
        for row in read_shard(src_path):
            if n not in drop:
                yield row
            n += 1

    k = write_shard(out, kept())
    if rows.size and int(rows.max()) >= n:
        raise RuntimeError(f"{src_path}: has {n} rows but dedup removes row {int(rows.max())}; the shard changed "
                           f"after its signatures were computed, rerun dedup")
    mark_done(out, {"kept": k, "input": str(src_path)})
    return {"source": src_path.parent.name, "docs_in": n, "kept": k,
            "exact_duplicates": int((reason == EXACT).sum()), "near_duplicates": int((reason == NEAR).sum())}


# -- report ----------------------------------------------------------------------------------------------------


def _marker_stats(marker_dir: Path, name: str, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append(json.loads((marker_dir / f"{name}-{i:05d}.done").read_text())["stats"])
    return out


def finalize(dedup_root: str, fp: str, mh_kw: dict, ranges: int, marker_dir: str,
             shapes: list[tuple[str, int]], num_inputs: int) -> dict[str, Any]:
    """dedup_stats.json (merged from the task markers) and the _DONE.json marker of the whole stage."""
    root, marks = Path(dedup_root), Path(marker_dir)
    filt = _marker_stats(marks, "dedup-filter", num_inputs)
    per_source: dict[str, dict[str, int]] = {}
    for s in filt:
        c = per_source.setdefault(s["source"], {"docs_in": 0, "kept": 0, "exact_duplicates": 0,
                                                "near_duplicates": 0})
        for k in c:
            c[k] += s[k]
    shapes_d = dict(shapes)
    buckets = _marker_stats(marks, "dedup-buckets", shapes_d["dedup-buckets"]) if "dedup-buckets" in shapes_d \
        else []
    last = [n for n in shapes_d if n.startswith("dedup-components-")][-1]
    final = _marker_stats(marks, last, 1)[0]
    b, rr = mh_kw["bands"], mh_kw["rows"]
    stats = {
        "docs_in": sum(s["docs_in"] for s in filt),
        "kept": sum(s["kept"] for s in filt),
        "exact_duplicates": sum(s["exact_duplicates"] for s in filt),
        "near_duplicates": sum(s["near_duplicates"] for s in filt),
        "candidate_pairs": sum(s["pairs"] for s in buckets if s["kind"] == "near"),
        "per_source": per_source,
        "near_duplicate_cluster_examples": final.get("cluster_examples", []),
        "partitions": ranges,
        "tasks": dict(shapes),
        "minhash": {**mh_kw, "threshold": round((1 / b) ** (1 / rr), 3),
                    "P(candidate|s)": {str(s): round(expected_collision_probability(s, b, rr), 4)
                                       for s in (0.5, 0.7, 0.8, 0.9)}},
        "fingerprint": fp,
    }
    write_json_atomic(root / "dedup_stats.json", stats)
    write_json_atomic(root / DEDUP_DONE, {"fingerprint": fp, "kept": stats["kept"]})
    return stats
