"""Host staging of an async save: DeepSpeed's state dicts copied into host buffers kept from one save to the next,
so that the step pays a memory copy and the background part writes the files."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pretrain.checkpoint.writer import TorchFile


def _copied(obj: Any, copy_tensor: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`obj` with each tensor replaced by `copy_tensor(tensor)` (in the order the pickler meets them). Containers are
    copied (their own type kept: OrderedDict, torch.Size, a namedtuple); other values are kept as they are (numbers,
    strings, DeepSpeed's config object: nothing the step changes, and some, like a process group, cannot be
    copied)."""
    if isinstance(obj, torch.Tensor):
        return copy_tensor(obj.detach())
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps a subclass and its attributes (a defaultdict's factory)
        for k, v in obj.items():
            out[k] = _copied(v, copy_tensor)
        return out
    if type(obj) is list:
        return [_copied(v, copy_tensor) for v in obj]
    if type(obj) is tuple:
        return tuple(_copied(v, copy_tensor) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_copied(v, copy_tensor) for v in obj))
    return obj  # torch.Size and other immutable values


class HostStaging:
    """The host buffers an async save's snapshots are copied into: what the background part serializes while
    training goes on. They are kept from one save to the next and refilled (the next save waits for the previous
    one's background part first, so nothing still reads them), as torch.distributed.checkpoint's cached staging and
    torchtitan's `async_with_pinned_mem` do: a fresh copy per save paid the allocator and the kernel's page faults
    on the step every time. Each buffer is compact (a view's copy no longer drags its whole flat buffer). From a
    GPU the buffers are page-locked, so the copies run at the link's speed and are queued without a wait for each
    (`synchronize` before the host reads them). A tensor whose shape or dtype changed gets a new buffer. Host memory: the peak is the same as with fresh copies (a snapshot lived through
    the background part), now held between saves."""

    def __init__(self) -> None:
        self._files: dict[str, list[torch.Tensor]] = {}
        self._this_save: set[str] = set()  # the keys filled since the last `synchronize`
        self._queued = False  # device-to-host copies queued and not yet waited for

    def snapshot(self, obj: Any, key: str) -> Any:
        """`obj` (the state dict of the file named `key`) copied into that file's buffers. A key seen twice in one
        save gets fresh buffers the second time, never the first one's."""
        while key in self._this_save:
            key += "+"
        self._this_save.add(key)
        old = self._files.get(key, [])
        new: list[torch.Tensor] = []

        def copy_tensor(t: torch.Tensor) -> torch.Tensor:
            buf = old[len(new)] if len(new) < len(old) else None
            pinned = t.device.type == "cuda"
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned)
            buf.copy_(t, non_blocking=pinned)
            self._queued |= pinned
            new.append(buf)
            return buf

        out = _copied(obj, copy_tensor)
        self._files[key] = new
        return out

    def synchronize(self) -> None:
        """The end of a save's snapshots: waits for the queued device-to-host copies (before anything reads the
        buffers on the host); the next snapshot of a file refills its buffers."""
        self._this_save.clear()
        if self._queued:
            torch.cuda.synchronize()
            self._queued = False

    def held_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for bufs in self._files.values() for b in bufs)


class SnapshotWrites:
    """DeepSpeed's checkpoint engine, recording the files it saves (each rank hashes the files it wrote itself) and,
    with `defer`, deferring them: `save` keeps a host snapshot of the state dict and the save's background part
    writes it through the wrapped engine before hashing, so the step pays a memory copy instead of serialization
    and the disk. Everything else is the wrapped engine's."""

    def __init__(self, inner: Any):
        self.inner, self.defer = inner, False
        self.staging = HostStaging()
        self.pending: list[tuple[Any, str]] = []
        self.paths: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def save(self, state_dict: Any, path: str) -> None:
        self.paths.append(path)
        if self.defer:
            self.pending.append((self.staging.snapshot(state_dict, Path(path).name), path))
        else:
            self.inner.save(state_dict, path)

    def take(self) -> tuple[list[tuple[Any, str]], list[str]]:
        """(the deferred writes, every path saved) since the last call; their snapshots are ready to read."""
        self.staging.synchronize()
        taken = self.pending, self.paths
        self.pending, self.paths = [], []
        return taken


def module_snapshot(engine, pending: list[tuple[Any, str]]) -> dict[str, Any] | None:
    """The host snapshot of the module's weights among this rank's deferred DeepSpeed files: its model-states file,
    which data-parallel rank 0 writes under ZeRO 0-2 (ZeRO-3's holds partitions only). None where there is none."""
    if engine.zero_optimization_stage() >= 3:
        return None
    for state, path in pending:
        if (
            path.endswith("model_states.pt")
            and isinstance(state, dict)
            and isinstance(state.get("module"), dict)
        ):
            return state["module"]
    return None


def write_snapshots(inner: Any, snapshots: list[tuple[Any, str]]) -> list[Any]:
    """The deferred writes of DeepSpeed's snapshots: for its TorchCheckpointEngine (`torch.save` in place) files the
    writer process can take; for any other engine one call of its own `save` in the background thread."""
    if type(inner).__name__ == "TorchCheckpointEngine":
        zipfile = bool(getattr(inner, "zipfile_serialization", True))
        return [TorchFile(Path(path), state, atomic=False, zipfile=zipfile) for state, path in snapshots]

    def write() -> None:
        for state, path in snapshots:
            inner.save(state, path)

    return [write] if snapshots else []


@contextlib.contextmanager
def recovery_scripts_deferred(engine, writes: list[Any] | None) -> Iterator[None]:
    """DeepSpeed's rank 0 copies its recovery scripts (zero_to_fp32.py, zero_to_torch.py) into the checkpoints
    folder at every save: two file copies on the step. With `writes` (an async save) they join the deferred
    writes; DeepSpeed's own method is back afterwards."""
    copy_scripts = getattr(engine, "_copy_recovery_script", None)
    if writes is not None and copy_scripts is not None:
        engine._copy_recovery_script = lambda path: writes.append(lambda: copy_scripts(path))
    try:
        yield
    finally:
        engine.__dict__.pop("_copy_recovery_script", None)
