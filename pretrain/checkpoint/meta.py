"""Checkpoint folder markers, tags and exit codes: the torch-free part of the checkpoint package, so that reading
which checkpoints are complete (`pretrain plan`'s resume preview) needs no torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.exit_codes import CANNOT_CONTINUE, PREEMPTED
from core.layout import CHECKPOINT_TAG as TAG_RE
from core.layout import COMPLETE

PREEMPTED_EXIT_CODE = PREEMPTED  # "checkpointed on a signal, requeue me" (core/exit_codes.py)
# Restarting cannot help (no usable checkpoint, diverged weights, a refused config change, a run folder held by
# another run). Any code but PREEMPTED stops the Slurm script from requeueing; this one says why
# (core.errors.CannotContinueError carries it).
CANNOT_CONTINUE_EXIT_CODE = CANNOT_CONTINUE


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def complete_tags(ckpt_dir: Path) -> list[str]:
    if not ckpt_dir.is_dir():
        return []
    tags = [p.name for p in ckpt_dir.iterdir() if TAG_RE.match(p.name) and (p / COMPLETE).is_file()]
    return sorted(tags)


def read_complete(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    return json.loads((ckpt_dir / tag / COMPLETE).read_text())
