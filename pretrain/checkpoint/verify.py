"""COMPLETE's file list and its verification: every file of a checkpoint with its size and xxh3 checksum, checked
in parallel on resume (each rank a share), so that a folder damaged after it was written is skipped, not loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from core.io import atomic_write
from pretrain.checkpoint.meta import COMPLETE
from pretrain.checkpoint.ranks import gather
from pretrain.checkpoint.writer import checksum

MANIFEST_VERSION = 2


HASHES_PREFIX = (
    "hashes.rank"  # a rank's done marker of a save finishing in the background (never in COMPLETE)
)


def checkpoint_files(folder: Path) -> list[str]:
    """Every file a checkpoint consists of (relative paths), COMPLETE and temporary files excepted."""
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file()
        and p.name != COMPLETE
        and ".tmp" not in p.name
        and not p.name.startswith(HASHES_PREFIX)
    )


def _my_share(names: list[str], rank: int, world: int) -> list[str]:
    return names[rank::world]


def write_complete(folder: Path, meta: dict[str, Any], files: dict[str, dict[str, Any]]) -> None:
    atomic_write(folder / COMPLETE, json.dumps({**meta, "manifest": MANIFEST_VERSION, "files": files}))


def verify_files(folder: Path, rank: int = 0, world: int = 1) -> list[str]:
    """What is wrong with this rank's share of a complete checkpoint's files (empty: nothing)."""
    try:
        meta = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError) as e:
        return [f"{COMPLETE} is unreadable ({e})"]
    files = meta.get("files")
    if files is None:  # written before COMPLETE listed its files: nothing to verify against
        return []
    problems = []
    for name in _my_share(sorted(files), rank, world):
        want, path = files[name], folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{name}: {size} bytes, {COMPLETE} records {want['size']}")
        elif checksum(path) != want["xxh3"]:
            problems.append(f"{name}: checksum differs from {COMPLETE} (content damaged)")
    return problems


def verify_checkpoint(folder: Path) -> list[str]:
    """Every problem of a checkpoint folder; under torch.distributed each rank verifies a share (collective)."""
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    return gather(verify_files(folder, rank, world))
