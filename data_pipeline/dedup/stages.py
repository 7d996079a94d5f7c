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

This module plans the stages; each phase's tasks are in their own module: signatures.py, buckets.py,
components.py, filter.py, and report.py (`finalize`), with the work files' helpers in work.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from pathlib import Path

from core.io import fingerprint
from core.layout import CLEAN_STATS
from core.run_layout import RunLayout
from data_pipeline.dedup.buckets import bucket_task
from data_pipeline.dedup.components import components_l0_task, labels_task, star_step_task, step_done
from data_pipeline.dedup.filter import filter_task
from data_pipeline.dedup.report import finalize
from data_pipeline.dedup.signatures import signature_task
from data_pipeline.executors import Stage
from data_pipeline.shards import (
    shard_name,
)


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
    per_input = {"inputs": [str(p) for p in inputs], "work": str(work)}  # what a task per cleaned shard reads
    signatures = {"ranges": R, "mh_kw": mh_kw, "minhash": dd.minhash.enabled, "exact": dd.exact}
    stages = [
        new_stage("dedup-signatures", signature_task, S, marks, labels=names, kwargs=per_input | signatures)
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
            kwargs=per_input | {"out_root": str(layout.dedup), "partitions": R, "exact_files": exact_files},
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
            out.append(dataclasses.replace(plain, done_fn=functools.partial(step_done, plain, before)))
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
