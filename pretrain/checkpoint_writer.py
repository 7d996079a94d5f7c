"""Writing and hashing an async save's files, in the save's background thread or in a writer process.

A save's background part serializes host snapshots (`torch.save`) and hashes the files. In a thread
(`checkpoint.async_writer: thread`, the default) that work shares the interpreter lock with the training loop, so it
writes through a Python file (torch's own file writer holds the lock for every byte it copies) and
hashes in chunks that release it; the thread, and the writer process below, run at the lowest CPU priority, so where
no core is idle they take the scheduler's leftovers rather than the step's time (`lowest_priority`), and while the
thread runs the training thread gets the lock back within 0.2 ms of asking (`short_switch_interval`).
`process` hands the same work to one writer process per rank, started before the first step, as
torch.distributed.checkpoint's process-based `async_save` and Megatron's async save do; the snapshots reach it
in one shared-memory block (`_ToShared`), and the background thread only waits for its answer. On one CPU rank,
whose step runs mostly in kernels that release the lock, it is no better than the thread (docs/results.md); it is
meant for a GPU node's loop, which holds the lock while it launches kernels. The writer ignores SIGINT and
SIGTERM (a preempted run still finishes its last save) and ends when its trainer is gone, so a killed run leaves
no writer behind to touch a folder the next run owns.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import math
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

import torch
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
    pause("hash")
    read_back = file_entries(folder, [n for n in names if n not in written])
    return {n: written[n] if n in written else read_back[n] for n in names}


_ALIGN = 64


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors a job pickles, in the order the pickler meets them (containers of the state dicts)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, TorchFile):
        yield from _tensors(obj.obj)


class _ToShared(pickle.Pickler):
    """Pickles a job with its tensors copied into one shared-memory block and sent as (offset, dtype, shape): one
    block by name instead of torch.multiprocessing's one file descriptor per tensor, each of which the trainer's
    resource-sharer thread hands over under the interpreter lock (that made the step after a save slower, not
    faster, than the thread writer: docs/results.md). The copies are torch's, which release the lock."""

    def __init__(self, file: io.BytesIO, shm: shared_memory.SharedMemory | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.offset = 0
        self.block = torch.frombuffer(shm.buf, dtype=torch.uint8) if shm is not None else None

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return None
        t = obj.detach()
        if t.numel() == 0 or self.block is None:
            return ("tensor", -1, t.dtype, tuple(t.shape))
        n = t.numel() * t.element_size()
        if self.offset + n > self.block.numel():  # a tensor `_tensors` did not see: pickled the plain way
            return None
        dest = self.block[self.offset : self.offset + n].view(t.dtype).view(t.shape)
        dest.copy_(t)
        pid = ("tensor", self.offset, t.dtype, tuple(t.shape))
        self.offset += -(-n // _ALIGN) * _ALIGN
        return pid


class _FromShared(pickle.Unpickler):
    """Each tensor its own storage over its slice of the block (torch.save writes a tensor's whole storage)."""

    def __init__(self, file: io.BytesIO, buf: memoryview | None) -> None:
        super().__init__(file)
        self.buf = buf

    def persistent_load(self, pid: Any) -> torch.Tensor:
        _, offset, dtype, shape = pid
        if offset < 0:
            return torch.empty(shape, dtype=dtype)
        assert self.buf is not None
        return torch.frombuffer(self.buf, dtype=dtype, count=math.prod(shape), offset=offset).view(shape)


def _shared_bytes(job: Any) -> int:
    return sum(-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in _tensors(job))


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
    lowest_priority()
    torch.set_num_threads(1)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        name, payload = msg
        shm = shared_memory.SharedMemory(name=name) if name else None
        try:
            files, folder, names = _FromShared(io.BytesIO(payload), shm.buf if shm else None).load()
            answer: tuple[bool, Any] = (True, write_and_hash(files, Path(folder), names))
        except Exception as e:  # noqa: BLE001  (sent back: the trainer stops every rank naming it)
            answer = (False, e.with_traceback(None))  # its frames held views of the block
        files = None  # every view of the block goes before it is closed
        if shm is not None:
            with contextlib.suppress(BufferError):  # a view still held: the mapping goes with it
                shm.close()
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

    def start(self) -> None:
        """Starts the writer unless it runs: the trainer calls it before its first step, so the writer's imports
        overlap the engine's start, not the steps around the first save."""
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, os.getpid()), name="checkpoint-writer", daemon=True
        )
        self._proc.start()
        child.close()
        # at an exit that did not close it (an error ended the run): killed before multiprocessing's own exit hook,
        # whose SIGTERM it ignores and whose join would then wait for ever (atexit runs last-in first)
        atexit.register(self._kill)

    def write_and_hash(
        self, files: list[TorchFile], folder: Path, names: list[str]
    ) -> dict[str, dict[str, Any]]:
        """`write_and_hash` in the writer process; blocks the calling thread (the save's background thread) only."""
        self.start()
        assert self._conn is not None
        job = (files, str(folder), names)
        size = _shared_bytes(job)
        shm = shared_memory.SharedMemory(create=True, size=size) if size else None
        pickler = None
        try:
            buf = io.BytesIO()
            pickler = _ToShared(buf, shm)
            pickler.dump(job)
            pickler = None  # its view of the block goes before the block is closed
            del job, files
            self._conn.send((shm.name if shm else None, buf.getvalue()))
            ok, value = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            self._proc.join(timeout=5)
            raise RuntimeError(
                f"the checkpoint writer process (pid {self._proc.pid}) exited with code {self._proc.exitcode} "
                f"while writing {folder}"
            ) from e
        finally:
            pickler = None
            if shm is not None:
                shm.close()
                shm.unlink()
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
