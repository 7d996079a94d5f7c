"""Writing and hashing an async save's files, in the save's background thread or in a writer process.

A save's background part serializes host snapshots (`torch.save`) and hashes the files. In a thread
(`checkpoint.async_writer: thread`) that work takes the interpreter lock from the training loop in slices: on
one CPU rank with a core free, the step after a save took about 20 ms longer than the save's own work
(docs/results.md). `process` hands the same work to one writer process per rank, started at the first save
(torch.distributed.checkpoint's process-based `async_save` and Megatron's async save do the same); the
snapshots reach it through shared memory (torch.multiprocessing's reductions), and the background thread only
waits for its answer. The writer ignores SIGINT and SIGTERM (a preempted run still finishes its last save) and
ends when its trainer is gone, so a killed run leaves no writer behind to touch a folder the next run owns.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions that send CPU tensors through shared memory)
import xxhash

from core.io import atomic_write

PAUSE_ENV = "LMSTACK_CKPT_PAUSE"
_CHUNK = 8 << 20


@dataclass
class TorchFile:
    """A file `torch.save` writes from a host snapshot: DeepSpeed's state dicts (written in place, as its
    TorchCheckpointEngine does: `atomic` False), the RNG state and the parity probe (atomic)."""

    path: Path
    obj: Any
    atomic: bool = True
    zipfile: bool = True  # DeepSpeed's engine passes its zipfile_serialization setting on


def pause(phase: str) -> None:
    """Test-only (LMSTACK_CKPT_PAUSE="hash=2,upload=5"): seconds the background sleeps before a phase, so that a
    test can kill a run inside it and a bench can stand in for a slow upload. Unset in every real run."""
    spec = os.environ.get(PAUSE_ENV, "").strip()
    if not spec:
        return
    for part in spec.split(","):
        name, _, secs = part.partition("=")
        if name.strip() not in ("write", "hash", "upload"):
            raise ValueError(f"{PAUSE_ENV}={spec!r}: {name.strip()!r} is not one of write, hash, upload")
        if name.strip() == phase:
            time.sleep(float(secs))


def checksum(path: Path) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_entries(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: {"size": (folder / n).stat().st_size, "xxh3": checksum(folder / n)} for n in names}


def write_and_hash(files: list[TorchFile], folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Writes `files`, then hashes `names` (relative to `folder`): a rank's share of a save's background part."""
    for f in files:
        if f.atomic:
            atomic_write(
                f.path, lambda out, f=f: torch.save(f.obj, out, _use_new_zipfile_serialization=f.zipfile)
            )
        else:
            torch.save(f.obj, f.path, _use_new_zipfile_serialization=f.zipfile)
    pause("hash")
    return file_entries(folder, names)


def _die_with_parent(parent: int) -> None:
    """Ends this process within a fifth of a second once its trainer is gone (a kill of the trainer must not leave a
    writer finishing files in a folder the next run will own). Polled, not Linux's parent-death signal: that one
    fires when the thread that started the writer ends, not the trainer."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="trainer-watch", daemon=True).start()


def _serve(conn: Connection, parent: int) -> None:
    """The writer process: one job at a time, answered with (True, hashes) or (False, the exception)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent)
    torch.set_num_threads(1)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        files, folder, names = job
        try:
            answer: tuple[bool, Any] = (True, write_and_hash(files, Path(folder), names))
        except Exception as e:  # noqa: BLE001  (sent back: the trainer stops every rank naming it)
            answer = (False, e)
        del files, job  # the snapshots' shared memory goes now, not at the next job
        conn.send(answer)


class WriterProcess:
    """One rank's writer process, started on first use (spawn: never a fork of a process that holds a process
    group or a CUDA context)."""

    def __init__(self) -> None:
        self._proc: Any = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def write_and_hash(
        self, files: list[TorchFile], folder: Path, names: list[str]
    ) -> dict[str, dict[str, Any]]:
        """`write_and_hash` in the writer process; blocks the calling thread (the save's background thread) only."""
        if self._proc is None or not self._proc.is_alive():
            ctx = mp.get_context("spawn")
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(
                target=_serve, args=(child, os.getpid()), name="checkpoint-writer", daemon=True
            )
            self._proc.start()
            child.close()
            # at an exit that did not close it (an error ended the run): killed before multiprocessing's own exit
            # hook, whose SIGTERM it ignores and whose join would then wait for ever (atexit runs last-in first)
            atexit.register(self._kill)
        assert self._conn is not None
        try:
            self._conn.send((files, str(folder), names))
            ok, value = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            self._proc.join(timeout=5)
            raise RuntimeError(
                f"the checkpoint writer process (pid {self._proc.pid}) exited with code {self._proc.exitcode} "
                f"while writing {folder}"
            ) from e
        if not ok:
            raise value
        return value

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)

    def close(self) -> None:
        """Ends the writer once it has answered (the run's end); a no-op when none was started."""
        if self._proc is None:
            return
        try:
            assert self._conn is not None
            self._conn.send(None)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
        self._proc = self._conn = None
