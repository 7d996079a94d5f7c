"""Dedup phase 4: a cleaned shard minus its removed rows -> dedup/<source>/<shard>, with its marker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from data_pipeline.dedup.work import EXACT, NEAR, read_key
from data_pipeline.shards import (
    mark_done,
    read_shard,
    write_shard,
)


def filter_task(
    i: int, *, inputs: list[str], work: str, out_root: str, partitions: int, exact_files: list[str]
) -> dict[str, Any]:
    src_path = Path(inputs[i])
    rows = read_key([str(Path(work) / "remove" / f"p{p:05d}.npz") for p in range(partitions)], f"s{i}", 0)
    exact_gids = read_key(exact_files, f"s{i}", 0)
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
