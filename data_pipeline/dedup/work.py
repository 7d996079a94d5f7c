"""Work files of the dedup tasks: written atomically by their one task, routed by hash range."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.io import remove_orphans
from data_pipeline.shards import (
    _atomic_write_bytes,
)

EXACT, NEAR = 1, 2


def save_npy(path: Path, arr: np.ndarray) -> None:
    save_work(Path(path), lambda f: np.save(f, arr))


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    save_work(Path(path), lambda f: np.savez(f, **arrays))


def save_work(path: Path, write) -> None:
    """A work file has one writer, its task: the temporary file of a killed earlier attempt at it is an orphan
    (the 20-kill soak found `.s00000-r0000.npz.*.tmp` left in a finished run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    _atomic_write_bytes(path, write)


def range_of(keys: np.ndarray, ranges: int) -> np.ndarray:
    """Hash range of a uint64 key: the top 32 bits scaled to [0, ranges) (ranges < 2^32, no overflow)."""
    return ((keys >> np.uint64(32)) * np.uint64(ranges)) >> np.uint64(32)


def node_partition(gids: np.ndarray, partitions: int) -> np.ndarray:
    """Node partition of each gid: a Fibonacci hash, so a shard's rows spread over every partition."""
    with np.errstate(over="ignore"):
        return range_of(gids.astype(np.uint64, copy=False) * np.uint64(0x9E3779B97F4A7C15), partitions)


def by_key(arr: np.ndarray, key: np.ndarray, n: int, prefix: str) -> dict[str, np.ndarray]:
    """{prefix<k>: rows of arr whose key is k} for the keys present (a missing member reads as empty)."""
    order = np.argsort(key, kind="stable")
    arr, key = arr[order], key[order]
    bounds = np.searchsorted(key, np.arange(n + 1))
    return {f"{prefix}{k}": arr[bounds[k] : bounds[k + 1]] for k in range(n) if bounds[k + 1] > bounds[k]}


def read_key(files: list[str], key: str, width: int) -> np.ndarray:
    """Concatenate member `key` of every npz file (each must exist: a missing file raises, naming it)."""
    parts = []
    for f in files:
        with np.load(f) as z:
            if key in z.files:
                parts.append(z[key])
    if not parts:
        return np.zeros((0, width), np.uint64) if width else np.zeros(0, np.uint64)
    return np.concatenate(parts)
