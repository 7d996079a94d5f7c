"""A full disk, named: the free space of a checkpoint folder's filesystem and the one-line message a save (or an
export) that ran out of it stops with."""

from __future__ import annotations

import shutil
from pathlib import Path

from core.errors import is_disk_full


def free_bytes(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def disk_full(err: BaseException, free: int) -> bool:
    """ENOSPC, or torch's C++ writer's 'basic_ios::clear: iostream error' (no errno) with no space left."""
    return is_disk_full(err) or free < (4 << 20)


def disk_full_message(folder: Path, ckpt_dir: Path, free: int) -> str:
    """A save that failed on a full disk, whether its files were written on the step or in the background."""
    return (
        f"saving checkpoint {folder} failed: the disk is full ({free / 2**20:.1f} MiB free on the filesystem of "
        f"{ckpt_dir}); free space or lower checkpoint.keep_last, then resume"
    )
