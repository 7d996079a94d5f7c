"""Checkpoints that survive being killed at any moment, owned by one `CheckpointManager` (manager.py).

One module per concern: manager (the run's checkpoints: resume point, when to save, the save in flight, the end),
save (one save and its background part), staging (host snapshots of an async save), writer (writing and hashing in
the background thread), verify (COMPLETE's file list and its check), resume (which checkpoint, and loading it),
remote (a remote run's upload and download), rng, nonfinite (weights never marked complete), probe and parity (the
export-parity probe and its check), safe_load (loading checkpoint files that run no code), resume_diff (a resume's
changed config), universal (another world size), tokenizer (the tokenizer identity), prune (old and abandoned
folders), disk (a full disk named), ranks (how the ranks agree) and meta (markers and tags, torch-free).

Only meta's names are exported here: importing the package needs no torch (`pretrain plan` reads which checkpoints
are complete without it).
"""

from pretrain.checkpoint.meta import (
    CANNOT_CONTINUE_EXIT_CODE,
    COMPLETE,
    PREEMPTED_EXIT_CODE,
    TAG_RE,
    complete_tags,
    read_complete,
    tag_for,
)

__all__ = [
    "CANNOT_CONTINUE_EXIT_CODE",
    "COMPLETE",
    "PREEMPTED_EXIT_CODE",
    "TAG_RE",
    "complete_tags",
    "read_complete",
    "tag_for",
]
