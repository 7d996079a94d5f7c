"""Sharded exact + MinHash-LSH dedup as stages of independent, restartable tasks.

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
3. components               connected components of the edge graph, partitioned by a hash of the document id
                           into P = R node partitions, so no task holds every duplicate:
   components-L0 (E/F)     union-find over F edge files -> a star forest per group, routed to P partitions.
                           Memory: 16 bytes x edges in F edge files (each bounded by its range).
   components-large<k>,    K = `component_rounds` rounds of the alternating algorithm of Kiveris et al. (2014,
   components-small<k>     "Connected Components in MapReduce and Beyond"): large-star (every node links its larger
   (P tasks each)          neighbours to its smallest neighbour) then small-star (every node links its smaller
                           neighbours to the smallest of them). Task p reads the edges keyed by the nodes of
                           partition p from every producer of the previous step and writes its output edges
                           routed to the partition of their key node. Converges to stars centred on each
                           component's smallest gid in O(log n) rounds (a chain of 2^k documents needs ~k). A
                           round that changed nothing is the fixed point; the rounds after it are never
                           scheduled. Memory: ~3 x 16 bytes x the edges keyed by the partition's nodes, i.e.
                           ~2 x duplicate edges / P, plus at most one component's star (every member of a cluster
                           links to its root, so the root's task holds the whole cluster): bounded by the
                           partition and the largest cluster, never by the corpus.
   components-labels (P)   finds the first round that changed nothing (none: fails naming
                           `data.dedup.component_rounds`; raising it keeps the finished tasks) and writes
                           remove/p<p>.npz: per input shard the rows of partition p's non-root nodes and their
                           roots. Memory: the partition's edges.
4. filter (S tasks)       shard s minus its removed rows (read from its key in each of the P label files and
                           the R exact-duplicate files) -> dedup/<source>/<shard name>, with its marker.
                           Memory: one shard's removal list; rows are streamed.

The kept document of a cluster is its smallest gid, i.e. the earliest in corpus order (source order, then shard,
then row), independent of task timing, partitioning and executor. Every task writes its files atomically and
then its marker; a rerun does only the tasks without one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from core.io import fingerprint, remove_orphans
from core.layout import CLEAN_STATS, DEDUP_STATS
from core.run_layout import RunLayout
from data_pipeline.dedup.exact import content_hash
from data_pipeline.dedup.minhash import MinHasher, expected_collision_probability
from data_pipeline.executors import Stage
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
    stats_path = layout.clean / CLEAN_STATS
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
            # vanished: the signatures task for it reports it
            files.append([f"{p.parent.name}/{p.name}", None, None])
    # component_rounds only appends rounds: raising it after a non-converged run keeps the finished tasks.
    blob = {
        "dedup": cfg.data.dedup.model_dump(mode="json", exclude={"component_rounds"}),
        "ranges": ranges,
        "inputs": files,
    }
    return fingerprint(blob)


def component_stage_names(rounds: int) -> list[str]:
    steps = [f"dedup-components-{kind}{k}" for k in range(rounds) for kind in ("large", "small")]
    return ["dedup-components-L0", *steps, "dedup-components-labels"]


def stage_shapes(
    num_inputs: int, ranges: int, bands: int, fan_in: int, minhash: bool, exact: bool, rounds: int
) -> list[tuple[str, int]]:
    """[(stage name, tasks)]: what a Slurm pipeline renders before the corpus exists."""
    n_edges = (bands * ranges if minhash else 0) + (ranges if exact else 0)
    shapes = [("dedup-signatures", num_inputs)]
    if n_edges:
        shapes.append(("dedup-buckets", n_edges))
        names = component_stage_names(rounds)
        shapes += [(names[0], math.ceil(n_edges / fan_in))] + [(n, ranges) for n in names[1:]]
    else:  # nothing to compare: the labels stage still writes the (empty) removal files the filter reads
        shapes.append(("dedup-components-labels", ranges))
    shapes.append(("dedup-filter", num_inputs))
    return shapes


def plan_shapes(cfg, num_inputs: int, ranges: int) -> list[tuple[str, int]]:
    dd = cfg.data.dedup
    return stage_shapes(
        num_inputs,
        ranges,
        dd.minhash.bands,
        dd.merge_fan_in,
        dd.minhash.enabled,
        dd.exact,
        dd.component_rounds,
    )


def build_stages(cfg) -> list[Stage]:
    """The dedup stages of this run, in order (needs the finished clean stage)."""
    layout = RunLayout(cfg)
    layout.store.pull([layout.clean])  # a remote run: the cleaned shards, wherever they were written
    dd = cfg.data.dedup
    inputs = _clean_inputs(cfg)
    docs = json.loads((layout.clean / CLEAN_STATS).read_text()).get("totals", {}).get("kept", 0)
    R = num_partitions(cfg, docs)
    fp = _fingerprint(cfg, inputs, R)
    work = layout.dedup / "_work" / fp
    marks = work / "markers"
    # a remote run: every task uploads what it wrote under dedup/ before its marker (storage.py)
    new_stage = functools.partial(
        Stage, store=layout.store, outputs=(str(work), str(layout.dedup)), exclude=("_work",)
    )
    B = dd.minhash.bands
    mh_kw = {"ngram": dd.minhash.ngram, "bands": B, "rows": dd.minhash.rows, "seed": dd.minhash.seed}
    names = tuple(f"{p.parent.name}/{p.name}" for p in inputs)
    S = len(inputs)
    stages = [
        new_stage(
            "dedup-signatures",
            signature_task,
            S,
            marks,
            labels=names,
            kwargs={
                "inputs": [str(p) for p in inputs],
                "work": str(work),
                "ranges": R,
                "mh_kw": mh_kw,
                "minhash": dd.minhash.enabled,
                "exact": dd.exact,
            },
        )
    ]
    jobs = ([("b", b, r) for b in range(B) for r in range(R)] if dd.minhash.enabled else []) + (
        [("x", 0, r) for r in range(R)] if dd.exact else []
    )
    edge_files = [
        str(work / "pairs" / (f"b{b:03d}-r{r:04d}.npy" if k == "b" else f"x-r{r:04d}.npy"))
        for k, b, r in jobs
    ]
    if jobs:
        stages.append(
            new_stage(
                "dedup-buckets",
                bucket_task,
                len(jobs),
                marks,
                labels=tuple(f"band {b} range {r}" if k == "b" else f"exact range {r}" for k, b, r in jobs),
                kwargs={"jobs": jobs, "work": str(work), "num_inputs": S, "ranges": R},
            )
        )
    exact_files = [str(work / "pairs" / f"xdup-r{r:04d}.npz") for r in range(R)] if dd.exact else []
    stages += component_stages(
        edge_files,
        work,
        marks,
        R,
        dd.merge_fan_in,
        dd.component_rounds,
        names,
        exact_files,
        make_stage=new_stage,
    )
    shapes_list = [(st.name, st.num_tasks) for st in stages] + [("dedup-filter", S)]
    stages.append(
        new_stage(
            "dedup-filter",
            filter_task,
            S,
            marks,
            labels=names,
            kwargs={
                "inputs": [str(p) for p in inputs],
                "work": str(work),
                "out_root": str(layout.dedup),
                "partitions": R,
                "exact_files": exact_files,
            },
            finalize=functools.partial(finalize, str(layout.dedup), fp, mh_kw, R, str(marks), shapes_list, S),
        )
    )
    return stages


def component_stages(
    edge_files: list[str],
    work: Path,
    marks: Path,
    partitions: int,
    fan_in: int,
    rounds: int,
    shard_names: tuple[str, ...],
    exact_files: list[str] = (),
    make_stage: Callable[..., Stage] = Stage,
) -> list[Stage]:
    """L0 (union-find over groups of edge files), `rounds` x (large-star, small-star) over `partitions` node
    partitions, then labels: see the module docstring. `make_stage` builds each Stage (a remote run's store)."""
    cc = Path(work) / "cc"
    names = component_stage_names(rounds)
    out: list[Stage] = []
    prev: tuple[str, int] | None = None  # (file prefix, producers) of the previous step
    if edge_files:
        n0 = math.ceil(len(edge_files) / fan_in)
        out.append(
            make_stage(
                names[0],
                components_l0_task,
                n0,
                marks,
                kwargs={
                    "inputs": edge_files,
                    "fan_in": fan_in,
                    "out": str(cc / "L0"),
                    "partitions": partitions,
                },
            )
        )
        prev = (str(cc / "L0"), n0)
        steps: list[tuple[str, str]] = []
        for name in names[1:-1]:
            kind = "large" if name.startswith("dedup-components-large") else "small"
            step = name.removeprefix("dedup-components-")
            # earlier rounds
            before = [f"dedup-components-large{k}" for k in range(int(step.removeprefix(kind)))]
            plain = make_stage(
                name,
                star_step_task,
                partitions,
                marks,
                kwargs={
                    "kind": kind,
                    "inputs": prev,
                    "out": str(cc / step),
                    "partitions": partitions,
                    "marker_dir": str(marks),
                    "prev_round": [n for n, _ in steps[-2:]] if kind == "large" else [],
                },
            )
            out.append(dataclasses.replace(plain, done_fn=functools.partial(_step_done, plain, before)))
            steps.append((name, str(cc / step)))
            prev = (str(cc / step), partitions)
    out.append(
        make_stage(
            names[-1],
            labels_task,
            partitions,
            marks,
            kwargs={
                "steps": steps if edge_files else [],
                "work": str(work),
                "shard_names": shard_names,
                "marker_dir": str(marks),
                "partitions": partitions,
                "rounds": rounds,
                "exact_files": list(exact_files),
            },
        )
    )
    return out


# -- tasks -----------------------------------------------------------------------------------------------------


def _save_npy(path: Path, arr: np.ndarray) -> None:
    _save_work(Path(path), lambda f: np.save(f, arr))


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    _save_work(Path(path), lambda f: np.savez(f, **arrays))


def _save_work(path: Path, write) -> None:
    """A work file has one writer, its task: the temporary file of a killed earlier attempt at it is an orphan
    (the 20-kill soak found `.s00000-r0000.npz.*.tmp` left in a finished run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    _atomic_write_bytes(path, write)


def _range_of(keys: np.ndarray, ranges: int) -> np.ndarray:
    """Hash range of a uint64 key: the top 32 bits scaled to [0, ranges) (ranges < 2^32, no overflow)."""
    return ((keys >> np.uint64(32)) * np.uint64(ranges)) >> np.uint64(32)


def signature_task(
    i: int, *, inputs: list[str], work: str, ranges: int, mh_kw: dict, minhash: bool, exact: bool
) -> dict[str, Any]:
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


def node_partition(gids: np.ndarray, partitions: int) -> np.ndarray:
    """Node partition of each gid: a Fibonacci hash, so a shard's rows spread over every partition."""
    with np.errstate(over="ignore"):
        return _range_of(gids.astype(np.uint64, copy=False) * np.uint64(0x9E3779B97F4A7C15), partitions)


def _by_key(arr: np.ndarray, key: np.ndarray, n: int, prefix: str) -> dict[str, np.ndarray]:
    """{prefix<k>: rows of arr whose key is k} for the keys present (a missing member reads as empty)."""
    order = np.argsort(key, kind="stable")
    arr, key = arr[order], key[order]
    bounds = np.searchsorted(key, np.arange(n + 1))
    return {f"{prefix}{k}": arr[bounds[k] : bounds[k + 1]] for k in range(n) if bounds[k + 1] > bounds[k]}


def _read_key(files: list[str], key: str, width: int) -> np.ndarray:
    """Concatenate member `key` of every npz file (each must exist: a missing file raises, naming it)."""
    parts = []
    for f in files:
        with np.load(f) as z:
            if key in z.files:
                parts.append(z[key])
    if not parts:
        return np.zeros((0, width), np.uint64) if width else np.zeros(0, np.uint64)
    return np.concatenate(parts)


def bucket_task(
    i: int, *, jobs: list[tuple[str, int, int]], work: str, num_inputs: int, ranges: int
) -> dict[str, Any]:
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
    else:  # exact copies of range r by input shard (for the filter's reasons) and by node partition (examples)
        dups = np.unique(edges[:, 1])
        _save_npz(
            Path(work) / "pairs" / f"xdup-r{r:04d}.npz",
            **_by_key(dups, (dups >> np.uint64(32)).astype(np.int64), num_inputs, "s"),
            **_by_key(dups, node_partition(dups, ranges).astype(np.int64), ranges, "n"),
        )
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


def _save_routed(path: Path, edges: np.ndarray, partitions: int) -> None:
    """Write keyed edges (key node, neighbour) as one npz, member p<k> = the rows whose key is in partition k."""
    key = node_partition(edges[:, 0], partitions).astype(np.int64) if len(edges) else np.zeros(0, np.int64)
    _save_npz(path, **_by_key(edges, key, partitions, "p"))


def _both_ways(edges: np.ndarray) -> np.ndarray:
    return np.concatenate([edges, edges[:, ::-1]])


def components_l0_task(
    i: int, *, inputs: list[str], fan_in: int, out: str, partitions: int
) -> dict[str, Any]:
    """Union-find over edge files [i*F, (i+1)*F) -> star forest, keyed both ways for the first large-star step."""
    mine = inputs[i * fan_in : (i + 1) * fan_in]
    parts = [np.load(f) for f in mine]
    edges = np.concatenate(parts) if parts else np.zeros((0, 2), np.uint64)
    forest = star_forest(edges.astype(np.uint64, copy=False))
    _save_routed(Path(f"{out}-{i:05d}.npz"), _both_ways(forest), partitions)
    return {"edges_in": int(len(edges)), "members": int(len(forest))}


def _groups(keyed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique keyed edges sorted by (key, neighbour); per row its group's min neighbour and group size."""
    if len(keyed) == 0:
        z = np.zeros(0, np.uint64)
        return z, z, z, np.zeros(0, np.int64)
    keyed = np.unique(keyed, axis=0)  # sorted by key, then neighbour
    u, v = keyed[:, 0], keyed[:, 1]
    start = np.ones(len(u), bool)
    start[1:] = u[1:] != u[:-1]
    idx = np.nonzero(start)[0]
    sizes = np.diff(np.append(idx, len(u)))
    gmin = np.repeat(v[idx], sizes)  # sorted by neighbour within a key: the first is the smallest
    return u, v, gmin, np.repeat(sizes, sizes)


def _changed(marker_dir: str, stage: str, partitions: int) -> int | None:
    """Edges changed by a step (summed over its tasks), None when it was skipped at the fixed point."""
    stats = [
        json.loads((Path(marker_dir) / f"{stage}-{j:05d}.done").read_text())["stats"]
        for j in range(partitions)
    ]
    return None if any(s.get("skipped") for s in stats) else sum(s["changed"] for s in stats)


_FIXED: set[tuple[str, str]] = set()  # (marker dir, round's large step) known to be the fixed point


def _step_done(stage: Stage, earlier_rounds: list[str], i: int) -> bool:
    """A step task is done when its marker exists (remotely on a remote run) or an earlier round changed nothing
    (the fixed point): the rounds after it are then not scheduled at all (no marker, no process), so a spare round
    costs nothing."""
    if stage.marker_exists(i):
        return True
    marker_dir, partitions = str(stage.marker_dir), stage.num_tasks
    for large in earlier_rounds:
        small = large.replace("-large", "-small")
        if (marker_dir, large) in _FIXED and (Path(marker_dir) / f"{small}-00000.done").exists():
            return True  # (a rerun after the work folder was deleted finds no marker and looks again)
        for attempt in range(2):
            try:
                if (
                    _changed(marker_dir, large, partitions) == 0
                    and _changed(marker_dir, small, partitions) == 0
                ):
                    _FIXED.add((marker_dir, large))
                    return True
                break
            except (OSError, ValueError, KeyError):  # that round has not run yet, or ran on another node
                if attempt or not stage.remote:
                    return False
                stage.pull(markers_only=True)
    return False


def star_step_task(
    i: int,
    *,
    kind: str,
    inputs: tuple[str, int],
    out: str,
    partitions: int,
    marker_dir: str,
    prev_round: list[str],
) -> dict[str, Any]:
    """One large-star or small-star step over the edges keyed by the nodes of partition i.

    large-star (input: both directions): node u with m = min(u, neighbours) links every neighbour v > u to m;
    output keyed by the larger end for small-star. small-star (input: keyed by the larger end, so each node sees
    its smaller neighbours N): m = min(N) and every v in N + {u}, v != m, links to m; output both directions.
    `changed` counts output edges that were not input edges; once a round changed nothing (the fixed point: a
    forest of stars centred on each component's smallest gid) the later rounds skip without reading anything.
    """
    if kind == "small" and json.loads(
        (Path(marker_dir) / f"dedup-components-large{out.rsplit('small', 1)[1]}-{i:05d}.done").read_text()
    )["stats"].get("skipped"):
        return {"skipped": "fixed point", "changed": 0}
    if prev_round and all(_changed(marker_dir, n, partitions) in (0, None) for n in prev_round):
        return {"skipped": "fixed point", "changed": 0}
    prefix, producers = inputs
    keyed = _read_key([f"{prefix}-{j:05d}.npz" for j in range(producers)], f"p{i}", 2)
    u, v, gmin, size = _groups(keyed)
    if kind == "large":
        m = np.minimum(u, gmin)
        sel = v > u
        new = np.stack([v[sel], m[sel]], axis=1)  # v > u >= m: keyed by its larger end v
        changed = int((m[sel] != u[sel]).sum())
        _save_routed(Path(f"{out}-{i:05d}.npz"), new, partitions)
    else:
        sel = v != gmin  # the smaller neighbours other than the smallest move to it; u keeps its edge to it
        first = np.ones(len(u), bool)
        first[1:] = u[1:] != u[:-1]
        new = np.concatenate(
            [np.stack([v[sel], gmin[sel]], axis=1), np.stack([u[first], gmin[first]], axis=1)]
        )
        changed = int(sel.sum())
        _save_routed(Path(f"{out}-{i:05d}.npz"), _both_ways(new), partitions)
    return {
        "edges_in": int(len(u)),
        "edges_out": int(len(new)),
        "changed": changed,
        "max_degree": int(size.max()) if len(size) else 0,
    }


def labels_task(
    i: int,
    *,
    steps: list[tuple[str, str]],
    work: str,
    shard_names: tuple[str, ...],
    marker_dir: str,
    partitions: int,
    rounds: int,
    exact_files: list[str],
) -> dict[str, Any]:
    """remove/p<i>.npz: per input shard (member s<k>) the rows of partition i's nodes that are not their
    component's smallest gid, and (root<k>) the gid of that smallest document, the one kept. Reads the small-star
    output of the first round that changed nothing; fails when no round reached that fixed point."""
    src = None
    for k in range(1, len(steps), 2):
        if (
            _changed(marker_dir, steps[k - 1][0], partitions) == 0
            and _changed(marker_dir, steps[k][0], partitions) == 0
        ):
            src = steps[k][1]
            break
    if steps and src is None:
        last = _changed(marker_dir, steps[-1][0], partitions)
        raise RuntimeError(
            f"connected components did not converge in data.dedup.component_rounds={rounds} rounds "
            f"(the last round still changed {last} edges); raise it and rerun: finished tasks are "
            f"kept"
        )
    keyed = (
        _read_key([f"{src}-{j:05d}.npz" for j in range(partitions)], f"p{i}", 2)
        if src
        else np.zeros((0, 2), np.uint64)
    )
    u, _, gmin, _ = _groups(keyed)
    first = np.ones(len(u), bool)
    first[1:] = u[1:] != u[:-1]
    members, roots = u[first], gmin[first]
    sel = roots < members  # at the fixed point a member's only neighbour is its root; a root's are larger
    members, roots = members[sel], roots[sel]
    shard = (members >> np.uint64(32)).astype(np.int64)
    rows = (members & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    _save_npz(
        Path(work) / "remove" / f"p{i:05d}.npz",
        **_by_key(rows, shard, len(shard_names), "s"),
        **_by_key(roots, shard, len(shard_names), "root"),
    )
    exact = _read_key(exact_files, f"n{i}", 0)
    near = ~np.isin(members, exact)
    examples = []
    for root in np.unique(roots[near])[:3]:
        ids = [root, *members[roots == root][:4]]
        examples.append([f"{shard_names[int(g) >> 32]}#{int(g) & 0xFFFFFFFF}" for g in ids])
    return {
        "members": int(len(members)),
        "clusters": int(len(np.unique(roots))),
        "cluster_examples": examples,
    }


def filter_task(
    i: int, *, inputs: list[str], work: str, out_root: str, partitions: int, exact_files: list[str]
) -> dict[str, Any]:
    src_path = Path(inputs[i])
    rows = _read_key([str(Path(work) / "remove" / f"p{p:05d}.npz") for p in range(partitions)], f"s{i}", 0)
    exact_gids = _read_key(exact_files, f"s{i}", 0)
    reason = np.where(np.isin(rows, (exact_gids & np.uint64(0xFFFFFFFF)).astype(np.uint32)), EXACT, NEAR)
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
        raise RuntimeError(
            f"{src_path}: has {n} rows but dedup removes row {int(rows.max())}; the shard changed "
            f"after its signatures were computed, rerun dedup"
        )
    mark_done(out, {"kept": k, "input": str(src_path)})
    return {
        "source": src_path.parent.name,
        "docs_in": n,
        "kept": k,
        "exact_duplicates": int((reason == EXACT).sum()),
        "near_duplicates": int((reason == NEAR).sum()),
    }


# -- report ----------------------------------------------------------------------------------------------------


def _marker_stats(marker_dir: Path, name: str, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append(json.loads((marker_dir / f"{name}-{i:05d}.done").read_text())["stats"])
    return out


def finalize(
    dedup_root: str,
    fp: str,
    mh_kw: dict,
    ranges: int,
    marker_dir: str,
    shapes: list[tuple[str, int]],
    num_inputs: int,
) -> dict[str, Any]:
    """dedup_stats.json (merged from the task markers) and the _DONE.json marker of the whole stage."""
    root, marks = Path(dedup_root), Path(marker_dir)
    filt = _marker_stats(marks, "dedup-filter", num_inputs)
    per_source: dict[str, dict[str, int]] = {}
    for s in filt:
        c = per_source.setdefault(
            s["source"], {"docs_in": 0, "kept": 0, "exact_duplicates": 0, "near_duplicates": 0}
        )
        for k in c:
            c[k] += s[k]
    shapes_d = dict(shapes)
    buckets = (
        _marker_stats(marks, "dedup-buckets", shapes_d["dedup-buckets"])
        if "dedup-buckets" in shapes_d
        else []
    )
    labels = _marker_stats(marks, "dedup-components-labels", shapes_d["dedup-components-labels"])
    steps = [n for n in shapes_d if n.startswith(("dedup-components-large", "dedup-components-small"))]
    rounds_used = next(
        (
            k // 2
            for k in range(1, len(steps), 2)
            if not any(
                s["changed"] for n in steps[k - 1 : k + 1] for s in _marker_stats(marks, n, shapes_d[n])
            )
        ),
        0,
    )
    b, rr = mh_kw["bands"], mh_kw["rows"]
    stats = {
        "docs_in": sum(s["docs_in"] for s in filt),
        "kept": sum(s["kept"] for s in filt),
        "exact_duplicates": sum(s["exact_duplicates"] for s in filt),
        "near_duplicates": sum(s["near_duplicates"] for s in filt),
        "candidate_pairs": sum(s["pairs"] for s in buckets if s["kind"] == "near"),
        "per_source": per_source,
        "near_duplicate_cluster_examples": [e for s in labels for e in s["cluster_examples"]][:5],
        "partitions": ranges,
        "component_rounds_to_fixed_point": rounds_used,
        "tasks": dict(shapes),
        "minhash": {
            **mh_kw,
            "threshold": round((1 / b) ** (1 / rr), 3),
            "P(candidate|s)": {
                str(s): round(expected_collision_probability(s, b, rr), 4) for s in (0.5, 0.7, 0.8, 0.9)
            },
        },
        "fingerprint": fp,
    }
    write_json_atomic(root / DEDUP_STATS, stats)
    write_json_atomic(root / DEDUP_DONE, {"fingerprint": fp, "kept": stats["kept"]})
    return stats
