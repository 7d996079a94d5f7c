"""The one atomic writer, and the hashing helpers.

A file is written to a temporary file in its own folder, flushed and fsynced, then renamed over the target
(atomic on POSIX), and the folder is fsynced so the rename survives a power cut. A reader thus
sees the old file or the new one, never a torn one, and a killed writer leaves at most a hidden
`.<name>.*.tmp` file, which `remove_orphans` deletes where its file has one writer (a shard, a checkpoint
pointer). The file gets the mode a plain `open()` would give it (0o666 minus the umask): `mkstemp` alone
creates 0600 files that other users of a shared run folder cannot read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from core.log import get_logger

__all__ = [
    "atomic_path",
    "atomic_write",
    "fingerprint",
    "fsync_dir",
    "json_bytes",
    "replace",
    "replace_dir",
    "sha256_bytes",
    "sha256_file",
    "umask",
    "follow_umask",
]

PathLike = str | os.PathLike[str]
log = get_logger(__name__)


def umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but only a fallback)
    os.umask(old)
    return old


def follow_umask(path: PathLike) -> None:
    """A file made by mkstemp (or a library that creates 0600 files, such as safetensors) gets the mode any
    file tool would give it: 0666 less the umask (0644 under 022), so teammates can read run outputs. A folder:
    every file and folder in it."""
    mask = umask()
    p = Path(path)
    items = [p, *p.rglob("*")] if p.is_dir() else [p]
    for q in items:
        if not q.is_symlink():
            os.chmod(q, (0o777 if q.is_dir() else 0o666) & ~mask)


def fsync_dir(folder: PathLike) -> None:
    """Makes a rename in `folder` durable; a no-op where directories cannot be opened (Windows) or synced."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace(src: PathLike, dst: PathLike) -> None:
    """Renames `src` over `dst` (a file or a folder) atomically and makes the rename durable."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def replace_dir(tmp: PathLike, folder: PathLike, aside: PathLike | None = None) -> Path:
    """Puts the finished folder `tmp` (made beside `folder`) in place of `folder`: the old one is moved aside,
    the new one renamed in, the old one removed. A crash leaves the old folder or the new one, and at most the old
    one inside `aside` (default: a fresh hidden `.<name>.old.<random>` beside it, which the caller's staging
    cleanup removes), never a half-written folder. No other path is touched: a user's own `<folder>.old` stays.
    `tmp` gets the mode `mkdir` would give it (mkdtemp: 0700)."""
    tmp, folder = Path(tmp), Path(folder)
    os.chmod(tmp, 0o777 & ~umask())
    if not folder.exists():
        replace(tmp, folder)
        return folder
    if aside is None:
        holder = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
    else:
        holder = Path(aside)
        holder.mkdir(parents=True)
    replace(folder, holder / folder.name)
    replace(tmp, folder)
    shutil.rmtree(holder)
    return folder


@contextlib.contextmanager
def atomic_path(path: PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yields a temporary path beside `path` for a writer that wants a file name (`fs.get_file`, a library's
    `save(path)`); on success the file is fsynced, given `mode` (default: 0o666 minus the umask) and renamed
    over `path`. On any error the temporary file is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, (0o666 & ~umask()) if mode is None else mode)
        replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_orphans(path: PathLike) -> list[Path]:
    """Delete `.<name>.*.tmp` left next to `path` by an `atomic_path` write that was killed. Only for a file with
    one writer (a shard and its marker, a run's `latest` pointer under its lock): any such temp is then dead."""
    path = Path(path)
    gone = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            tmp.unlink()
            gone.append(tmp)
        except FileNotFoundError:
            pass
    if gone:
        log.info(
            f"[io] removed {len(gone)} orphaned temporary file(s) of an interrupted write: "
            f"{', '.join(p.name for p in gone)}"
        )
    return gone


def atomic_write(
    path: PathLike, data: bytes | str | Callable[[IO[bytes]], Any], mode: int | None = None
) -> Path:
    """Writes `data` (bytes, text as UTF-8, or a function given the open binary file) to `path` atomically and
    durably (see the module docstring); returns the path."""
    path = Path(path)
    with atomic_path(path, mode) as tmp, open(tmp, "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
    return path


def json_bytes(obj: Any, indent: int | None = 1, sort_keys: bool = False) -> bytes:
    return json.dumps(obj, indent=indent, sort_keys=sort_keys, default=str, ensure_ascii=False).encode()


# -------------------------------------------------------------------------------------------------------- hashing


def sha256_bytes(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def sha256_file(path: PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint(obj: Any, length: int = 16) -> str:
    """A short, stable hash of JSON-able settings (sorted keys): what completion markers compare."""
    return sha256_bytes(json.dumps(obj, sort_keys=True))[:length]
