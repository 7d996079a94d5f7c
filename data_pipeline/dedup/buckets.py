"""Dedup phase 2: documents sharing a band bucket (or a content hash) -> edges (first gid, gid)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.dedup.work import by_key, node_partition, save_npy, save_npz


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
        save_npy(Path(work) / "pairs" / f"b{b:03d}-r{r:04d}.npy", edges)
    else:  # exact copies of range r by input shard (for the filter's reasons) and by node partition (examples)
        dups = np.unique(edges[:, 1])
        save_npz(
            Path(work) / "pairs" / f"xdup-r{r:04d}.npz",
            **by_key(dups, (dups >> np.uint64(32)).astype(np.int64), num_inputs, "s"),
            **by_key(dups, node_partition(dups, ranges).astype(np.int64), ranges, "n"),
        )
        save_npy(Path(work) / "pairs" / f"x-r{r:04d}.npy", edges)
    return {"kind": "near" if kind == "b" else "exact", "docs": int(len(pairs)), "pairs": int(len(edges))}
