"""What an export folder is bound to, checked on the ground floor so that every consumer runs the same check:
`model.init_from` at config load (runconfig) and `adapt finetune|transfer|continue` before any work.

An export of ours lists its weight files and their sha256 in the COMPLETE that `pretrain export` writes last;
only those files are hashed (an adapter saved into a subfolder later is not the export's weights). Every
safetensors file is also checked for its length against its own header, so a truncated copy is refused with
its file name instead of a `SafetensorError` on every rank."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from core.errors import LmstackError
from core.layout import COMPLETE  # the marker `pretrain export` writes last

TRAINING_STATE = "training_state.json"  # written by `pretrain export`: step, tokens, loss, the checkpoint
WEIGHTS_INDEX = "model.safetensors.index.json"  # a sharded export: tensor name -> shard file
_HEADER_LIMIT = 100 << 20  # safetensors' own bound on the JSON header


class ExportMismatchError(LmstackError, ValueError):
    """An export folder whose weights differ from what `pretrain export` recorded, one of ours without its
    COMPLETE, or a weight file cut short: results measured on it would be another model's (or none at all)."""


def _record(folder: Path) -> dict[str, object] | None:
    """The folder's COMPLETE record (None: none, or not ours)."""
    try:
        record = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def weight_files(folder: str | Path) -> list[str]:
    """The export's weight files, relative to it: those its COMPLETE lists (`weights_files`), else the folder's
    own top-level *.safetensors (what `save_pretrained` writes; nothing in a subfolder is the model's)."""
    folder = Path(folder)
    listed = (_record(folder) or {}).get("weights_files")
    if isinstance(listed, list) and all(isinstance(f, str) for f in listed):
        return sorted(listed)
    return sorted(f.name for f in folder.glob("*.safetensors") if f.is_file())


def weights_hash(folder: str | Path, files: list[str] | None = None) -> str:
    """sha256 over `files` (default: weight_files), by relative path then bytes: what results are bound to."""
    folder = Path(folder)
    names = sorted(weight_files(folder) if files is None else files)
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0")
        with open(folder / name, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return h.hexdigest()


def _older_hash(folder: Path) -> str:
    """The hash an export written before COMPLETE listed its files recorded: every *.safetensors below it."""
    return weights_hash(folder, [f.relative_to(folder).as_posix() for f in folder.rglob("*.safetensors")])


class NotAModelFolderError(LmstackError, ValueError):
    """A model path that is no local model folder (missing, or without config.json): lmstack never looks a name
    up on a hub, so it is said in one line with the folder."""


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing (None: its length is what its header describes). Reads
    the 8-byte header length and the JSON header only; the tensors are not loaded."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > _HEADER_LIMIT or 8 + n > size:
            return f"{size} bytes, but its header alone claims {n} bytes"
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError):
            return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return "its header does not describe tensors"
    if 8 + n + end != size:
        return f"{size} bytes, but its header describes {8 + n + end}: cut short, or appended to"
    return None


def check_weight_files(folder: str | Path, files: list[str] | None = None) -> None:
    """Every weight file (default: weight_files, plus the shards an index names) is whole: one line naming the
    first that is not."""
    folder = Path(folder)
    names = list(weight_files(folder) if files is None else files)
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        try:
            names += sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        except (ValueError, AttributeError, UnicodeDecodeError):
            raise ExportMismatchError(
                f"{index}: not a valid safetensors index (JSON with a weight_map)"
            ) from None
    for name in dict.fromkeys(names):
        path = folder / name
        if not path.is_file():
            raise ExportMismatchError(f"{path}: missing (a weight file the export lists); export again")
        problem = safetensors_problem(path)
        if problem is not None:
            raise ExportMismatchError(
                f"{path}: damaged or truncated safetensors file ({problem}); copy or export it again"
            )


def verify_export(folder: str | Path) -> None:
    """Refuses a path that is no model folder, a folder whose weight files are cut short, an export of ours whose weights changed since it was
    written, or one of ours that has no COMPLETE (copied while being written, or assembled by hand). A plain
    Hugging Face folder (neither file) passes once its files are whole: it is used as given."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise NotAModelFolderError(
            f"{folder}: no model here (no config.json; lmstack reads a local folder and downloads nothing): "
            "export one with `python -m pretrain export`, or pass --model <an exported folder>"
        )
    check_weight_files(folder)
    if not (folder / COMPLETE).is_file():
        if (folder / TRAINING_STATE).is_file():
            raise ExportMismatchError(
                f"{folder}: an incomplete export (no {COMPLETE}, which `pretrain export` writes last): "
                "export again (`python -m pretrain export`)"
            )
        return
    record = _record(folder)
    if record is None:
        raise ExportMismatchError(
            f"{folder / COMPLETE}: not the JSON record `pretrain export` writes; export again"
        )
    want = record.get("weights_sha256")
    if want == weights_hash(folder):
        return
    if "weights_files" not in record and want == _older_hash(folder):
        return  # written before COMPLETE listed its files, and nothing was added below it since
    raise ExportMismatchError(
        f"{folder}: its weights ({', '.join(weight_files(folder)) or '*.safetensors'}) differ from what "
        f"`pretrain export` wrote at step {record.get('step')} (weights_sha256 in {COMPLETE}): the files were "
        "changed or damaged since; export again (`python -m pretrain export`)"
    )
