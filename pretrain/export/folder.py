"""Export folders: what may be replaced by an export, and what a continued run started from. What an export is
bound to (its weight files and their hash in COMPLETE) and the check of it live in core/export_files.py, shared
with `model.init_from` at config load."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from core.errors import LmstackError
from core.export_files import (  # the one verification every consumer runs (init_from at load, adapt)
    COMPLETE,
    TRAINING_STATE,
    ExportMismatchError,
    verify_export,
    weight_files,
    weights_hash,
)

__all__ = ["ExportMismatchError", "TRAINING_STATE", "verify_export", "weight_files", "weights_hash"]


class ExportTargetError(LmstackError):
    """An export target that holds something other than an export of ours: replacing it would delete a user's
    files (a folder of their own, the run's checkpoints, the run folder itself)."""


def is_export(folder: str | Path) -> bool:
    """A folder `pretrain export` wrote: its COMPLETE records the weight hash, or (an interrupted older export)
    it holds our training_state.json."""
    folder = Path(folder)
    done = folder / COMPLETE
    if done.is_file():
        try:
            return "weights_sha256" in json.loads(done.read_text())
        except (ValueError, UnicodeDecodeError):
            return False
    return (folder / TRAINING_STATE).is_file()


def check_export_target(folder: str | Path) -> None:
    """An export may replace nothing, an empty folder, or an earlier export of ours; anything else is refused,
    named, before any work."""
    folder = Path(folder)
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir() or folder.is_symlink() or (any(folder.iterdir()) and not is_export(folder)):
            raise ExportTargetError(
                f"{folder} exists and is not an export of ours (no {COMPLETE} recording weights_sha256, which "
                "`pretrain export` writes): nothing was written or removed; give --out a new folder, or move it "
                "away"
            )
    _check_staging(folder)
    _check_writable(folder.parent)


# written first into a staging folder: what marks it as an export's own
STAGING_MARK = ".lmstack-export-staging"


def staging_folder(final: Path) -> Path:
    """Where an export to `final` is written before the rename (same parent: the rename is atomic)."""
    return final.parent / f".{final.name}.staging"


def make_staging(final: Path) -> Path:
    """A fresh staging folder for an export to `final`, marked as ours before anything is written into it. One a
    killed export left (marked) is removed first; `check_export_target` has refused any other."""
    import shutil

    staging = _check_staging(final)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    (staging / STAGING_MARK).write_text("written by `pretrain export`; removed by the next export\n")
    return staging


def _check_staging(final: Path) -> Path:
    """`final`'s staging folder, refused (named, untouched) when something not ours has its name."""
    staging = staging_folder(final)
    if (staging.exists() or staging.is_symlink()) and not is_staging(staging, final.name):
        raise ExportTargetError(
            f"{staging} exists and is not a staging folder of lmstack's (no {STAGING_MARK}; an export stages "
            f"{final.name} there before renaming it into place): nothing was written or removed; move it away"
        )
    return staging


def is_staging(staging: Path, name: str) -> bool:
    """A real folder (not a link) that an export marked, or that holds nothing but what an older export (before
    the mark) put there: the export folder and the earlier export set aside."""
    if staging.is_symlink() or not staging.is_dir():
        return False
    names = {p.name for p in staging.iterdir()}
    return STAGING_MARK in names or names <= {name, f"{name}.previous"}


def _check_writable(folder: Path) -> None:
    """The export is staged in, and renamed into, `folder` (made if missing): its nearest existing ancestor must
    take a file. A read-only run (archived, a snapshot, a shared copy) is said in one line, with the way out."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        with tempfile.TemporaryFile(
            dir=probe, prefix=".write-test-"
        ):  # unnamed (O_TMPFILE): nothing left behind
            pass
    except OSError as e:
        raise ExportTargetError(
            f"{probe} is not writable ({e.strerror or e}): nothing was exported; export a read-only run with "
            "--out <a writable folder>"
        ) from None


def started_from(folder: str | Path) -> dict[str, object]:
    """What a continued run started from (its export records it): the folder, the hash of its weights, and,
    when it is an export of ours, the step and tokens it had trained."""
    folder = Path(folder)
    record: dict[str, object] = {"path": str(folder), "weights_sha256": weights_hash(folder)}
    state = folder / TRAINING_STATE
    if state.is_file():
        prior = json.loads(state.read_text())
        record |= {k: prior[k] for k in ("step", "tokens_seen") if k in prior}
    return record
