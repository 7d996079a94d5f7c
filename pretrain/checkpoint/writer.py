"""Writing and hashing an async save's files in the save's background thread.

A save's background part serializes host snapshots (`torch.save`) and hashes the files. That work shares the
interpreter lock with the training loop, so it writes through a Python file (torch's own file writer holds the
lock for every byte it copies) and hashes in chunks that release it; the thread runs at the lowest CPU priority,
so where no core is idle it takes the scheduler's leftovers rather than the step's time (`lowest_priority`), and
while it runs the training thread gets the lock back within 0.2 ms of asking (`short_switch_interval`).

A writer process per rank (torch.distributed.checkpoint's process-based async_save) was tried and removed: on CPU
ranks it was no better than this thread, and it was never measured winning on a GPU (docs/training.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
import xxhash

from core.io import atomic_write

_CHUNK = 8 << 20


@dataclass
class TorchFile:
    """A file `torch.save` writes from a host snapshot: DeepSpeed's state dicts (written in place, as its
    TorchCheckpointEngine does: `atomic` False), the RNG state and the parity probe (atomic)."""

    path: Path
    obj: Any
    atomic: bool = True
    zipfile: bool = True  # DeepSpeed's engine passes its zipfile_serialization setting on

    def save(self, out: Any) -> None:
        torch.save(self.obj, out, _use_new_zipfile_serialization=self.zipfile)

    def write(self) -> dict[str, Any]:
        """Writes the file; returns its entry (size, xxh3), hashed from the bytes on their way to it."""
        writers: list[_HashingWriter] = []

        def save(f: IO[bytes]) -> None:
            writers.append(_HashingWriter(f))
            self.save(writers[0])

        if self.atomic:
            atomic_write(self.path, save)
        else:
            # a Python file, not the path: torch's own file writer holds the interpreter lock while it copies every
            # byte, so the training loop waits for it; a Python file's writes release the lock (bench/checkpoint_gil.py).
            # Buffered: its write() writes all it is given (torch ignores the count a raw write returns)
            with open(self.path, "wb") as f:
                save(f)
        w = writers[0]
        if self.path.stat().st_size != w.size:  # not written front to back: read it back instead
            return file_entry(self.path)
        return {"size": w.size, "xxh3": w.hash.hexdigest()}


class _HashingWriter:
    """Hashes what torch.save writes as it goes, so that the save's background part does not read its files back
    (a second pass over every byte, from disk where the page cache has let them go). No fileno(): torch's legacy
    format then writes its storages through write() too."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.hash, self.size = f, xxhash.xxh3_64(), 0

    def write(self, data: Any) -> int:
        n = self.f.write(data)
        self.hash.update(data)
        self.size += n
        return n

    def flush(self) -> None:
        self.f.flush()


def lowest_priority() -> None:
    """Puts the calling thread at the lowest CPU priority (nice 19): where no core is idle, the save's background
    part then takes its time from the scheduler's leftovers, not from the step. Linux keeps a nice value per
    thread; elsewhere this changes nothing."""
    with contextlib.suppress(AttributeError, OSError):  # no per-thread priority (not Linux), or not allowed
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


# CPython's default is 5 ms. A training loop gives the interpreter lock up in every torch op and asks for it back
# when the op returns; while another thread runs Python, each ask waits for that thread's interval to run out.
SAVE_SWITCH_INTERVAL_S = 2e-4


@contextlib.contextmanager
def short_switch_interval(seconds: float = SAVE_SWITCH_INTERVAL_S) -> Iterator[None]:
    """While a save's background part runs Python (torch.save's pickling, the probe's forward, an upload's client),
    the training thread gets the interpreter lock back within `seconds` of asking. With CPython's 5 ms, the steps
    after an async save on 2 busy CPU ranks lost more time in all than a synchronous save took (docs/results.md).
    Process-wide, so held for the background part only and put back after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def checksum(path: Path) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """A file's entry in COMPLETE (size, xxh3), read back from the file."""
    return {"size": path.stat().st_size, "xxh3": checksum(path)}


def file_entries(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: file_entry(folder / n) for n in names}


def write_and_hash(files: list[TorchFile], folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Writes `files`, then hashes `names` (relative to `folder`) that they did not hash as they were written: a
    rank's share of a save's background part."""
    written = {}
    for f in files:
        entry = f.write()
        if f.path.is_relative_to(folder):
            written[str(f.path.relative_to(folder))] = entry
    read_back = file_entries(folder, [n for n in names if n not in written])
    return {n: written[n] if n in written else read_back[n] for n in names}
