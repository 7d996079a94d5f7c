"""Removing old and abandoned checkpoint folders, never following a link the user made."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from core.log import get_logger
from pretrain.checkpoint.meta import COMPLETE, TAG_RE, complete_tags
from pretrain.checkpoint.universal import UNIVERSAL_SUFFIX

log = get_logger(__name__)


def prune_checkpoints(ckpt_dir: Path, keep_last: int) -> None:
    """Removes the complete checkpoints older than the newest `keep_last` (rank 0, after a save's COMPLETE)."""
    for old in complete_tags(ckpt_dir)[:-keep_last]:
        # COMPLETE first: a kill mid-removal leaves an incomplete folder, which the next save removes
        if not unlink_if_link(ckpt_dir / old):
            (ckpt_dir / old / COMPLETE).unlink(missing_ok=True)
            shutil.rmtree(ckpt_dir / old, ignore_errors=True)
        universal = ckpt_dir / (old + UNIVERSAL_SUFFIX)
        if not unlink_if_link(universal):
            shutil.rmtree(universal, ignore_errors=True)


def unlink_if_link(path: Path) -> bool:
    """A step folder that is a symbolic link was made by the user, not written by this run: the link alone goes
    (keep_last counts it like any checkpoint), never a file it points to, which may be another run's checkpoint.
    True when `path` was a link."""
    if not path.is_symlink():
        return False
    log.warning(
        f"[checkpoint] {path} is a link to {os.readlink(path)}: the link was removed, nothing it points to was "
        "touched"
    )
    path.unlink(missing_ok=True)
    return True


def remove_abandoned(ckpt_dir: Path, step: int) -> None:
    """Step folders before `step` without COMPLETE can never complete (training is past them, and one run holds
    the folder): what a kill mid-save at a step off the `every_steps` grid (a SIGTERM save) or mid-removal of an
    old checkpoint left. The 20-kill soak found one (step 13 of a run saving every 2 steps) in a finished run. A
    link is removed alone, never followed (`unlink_if_link`)."""
    for d in ckpt_dir.iterdir():
        m = TAG_RE.match(d.name)
        if m and int(m.group(1)) < step and d.is_dir() and not (d / COMPLETE).exists():
            if not unlink_if_link(d):
                shutil.rmtree(d, ignore_errors=True)
