"""Dedup phase 1 (stages.py's docstring): one cleaned shard -> its band keys and content hashes per hash range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.dedup.exact import content_hash
from data_pipeline.dedup.minhash import MinHasher
from data_pipeline.dedup.work import range_of, save_npz
from data_pipeline.shards import (
    read_shard,
)


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
    key_rng = range_of(keys, ranges)
    h = np.array(hashes, dtype=np.int64).view(np.uint64) if exact else np.zeros(0, np.uint64)
    h_rng = range_of(h, ranges)
    for r in range(ranges):
        members: dict[str, np.ndarray] = {}
        if minhash:
            for b in range(mh.bands):
                sel = key_rng[:, b] == r
                members[f"b{b}"] = np.stack([keys[sel, b], gids[sel]], axis=1)
        if exact:
            sel = h_rng == r
            members["exact"] = np.stack([h[sel], gids[sel]], axis=1)
        save_npz(Path(work) / "sig" / f"s{i:05d}-r{r:04d}.npz", **members)
    return {"docs": n}
