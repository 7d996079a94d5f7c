"""Checkpoints that survive being killed at any moment.

DeepSpeed's own `latest` file is written by rank 0 without waiting for the other ranks' ZeRO shards, and its
files are written in place: a kill mid-save can leave `latest` pointing at a half-written folder. So we save with
`save_latest=False`, have every rank write its RNG state, barrier, and only then rank 0 writes `COMPLETE` in the
tag folder and atomically replaces `latest`. Resume only ever considers folders holding `COMPLETE`.

`COMPLETE` lists every file of the checkpoint with its size and xxh3 checksum (computed and verified in parallel,
each rank a share of the files): a folder damaged after it was written (truncated, zeroed or deleted shard,
missing RNG file) fails verification on resume and the previous complete checkpoint is used instead of a crash
loop. Weights that are not finite are never marked complete.

A remote run (`run.output_dir: s3://...`) saves the same way into the local staging folder, then rank 0 uploads
the folder with COMPLETE after every file it lists and `latest` last; a resume lists the remote checkpoints,
downloads the newest whose COMPLETE exists and verifies it like a local one (falling back to older ones).

Off the critical path (`checkpoint.async_save`, default on): `save_checkpoint` returns once every rank's files are
written; hashing, COMPLETE, `latest`, pruning and the upload run in a background thread. Ranks agree that all files
are written through per-rank done markers in the folder, not a collective off the main thread; the next save and
the end of the run wait (`wait_for_save`) and stop every rank on a background failure. Since COMPLETE and `latest`
still come last, a kill at any moment leaves the previous complete checkpoint as `latest`. With
`checkpoint.async_writer: process` the writing and hashing run in each rank's writer process (`checkpoint_writer`).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from core.errors import is_disk_full
from core.io import atomic_write, sha256_bytes
from core.layout import RESOLVED_CONFIG
from core.log import get_logger

# The torch-free part (markers, tags, exit codes) lives in checkpoint_meta: `pretrain plan` reads it without torch.
from pretrain.checkpoint_meta import (  # noqa: F401  (re-exported)
    CANNOT_CONTINUE_EXIT_CODE,
    COMPLETE,
    PREEMPTED_EXIT_CODE,
    TAG_RE,
    CannotContinue,
    complete_tags,
    read_complete,
    tag_for,
)
from pretrain.checkpoint_writer import (  # noqa: F401  (file_entries and PAUSE_ENV re-exported)
    PAUSE_ENV,
    TorchFile,
    WriterProcess,
    checksum,
    file_entries,
    lowest_priority,
    pause,
    short_switch_interval,
    write_and_hash,
)
from pretrain.safe_load import check_folder, load

log = get_logger(__name__)

MANIFEST_VERSION = 2
HASHES_PREFIX = (
    "hashes.rank"  # a rank's done marker of a save finishing in the background (never in COMPLETE)
)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _checkpoint_files(folder: Path) -> list[str]:
    """Every file a checkpoint consists of (relative paths), COMPLETE and temporary files excepted."""
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file()
        and p.name != COMPLETE
        and ".tmp" not in p.name
        and not p.name.startswith(HASHES_PREFIX)
    )


def _my_share(names: list[str], rank: int, world: int) -> list[str]:
    return names[rank::world]


def write_complete(folder: Path, meta: dict[str, Any], files: dict[str, dict[str, Any]]) -> None:
    atomic_write(folder / COMPLETE, json.dumps({**meta, "manifest": MANIFEST_VERSION, "files": files}))


def verify_files(folder: Path, rank: int = 0, world: int = 1) -> list[str]:
    """What is wrong with this rank's share of a complete checkpoint's files (empty: nothing)."""
    try:
        meta = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError) as e:
        return [f"{COMPLETE} is unreadable ({e})"]
    files = meta.get("files")
    if files is None:  # written before COMPLETE listed its files: nothing to verify against
        return []
    problems = []
    for name in _my_share(sorted(files), rank, world):
        want, path = files[name], folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{name}: {size} bytes, {COMPLETE} records {want['size']}")
        elif checksum(path) != want["xxh3"]:
            problems.append(f"{name}: checksum differs from {COMPLETE} (content damaged)")
    return problems


def _gather(items: list[str]) -> list[str]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return items
    out: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, items)
    return [x for part in out for x in (part or [])]


def verify_checkpoint(folder: Path) -> list[str]:
    """Every problem of a checkpoint folder; under torch.distributed each rank verifies a share (collective)."""
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    return _gather(verify_files(folder, rank, world))


def _candidates(ckpt_dir: Path) -> list[str]:
    """The `latest` pointer first, then every complete folder, newest first."""
    tags = complete_tags(ckpt_dir)[::-1]
    latest = ckpt_dir / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        if tag in tags:
            tags.remove(tag)
            tags.insert(0, tag)
    return tags


def select_resume_tag(ckpt_dir: Path, warn=None, remote: str | None = None) -> str | None:
    """The newest complete checkpoint that passes verification (every rank verifies a share of its files; all
    ranks agree). None when there is none at all (a fresh run). A damaged one is skipped with a warning; when
    checkpoints exist but every one is damaged, CannotContinue: starting over would silently discard them.
    `remote` (the checkpoints folder of a remote run): checkpoints whose COMPLETE was uploaded count; each is
    downloaded into `ckpt_dir` (files already there with the right size are kept) and verified. A local complete
    checkpoint newer than every remote one (its upload failed) is verified, uploaded now, and used. `warn` receives
    each warning line (default: this module's logger)."""
    warn = warn or log.warning
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    skipped = []
    candidates = (
        _remote_candidates(ckpt_dir, remote) if remote else [(t, False) for t in _candidates(ckpt_dir)]
    )
    for tag, in_bucket in candidates:
        if in_bucket:
            fetch_checkpoint(ckpt_dir, tag, remote)
        problems = verify_checkpoint(ckpt_dir / tag)
        # a damaged local copy of a good remote file has the same size: fetch it again
        if in_bucket and problems:
            fetch_checkpoint(ckpt_dir, tag, remote, force=True)
            problems = verify_checkpoint(ckpt_dir / tag)
        if not problems:
            if remote and not in_bucket and rank == 0:
                from core.storage import RunStore

                warn(
                    f"[checkpoint] {tag} is newer than every checkpoint in {remote} (its upload failed): "
                    f"uploading it now"
                )
                RunStore(ckpt_dir, remote).push_or_warn([ckpt_dir / tag], warn)
            return tag
        skipped.append(
            f"{ckpt_dir / tag}: " + "; ".join(problems[:4]) + (" ..." if len(problems) > 4 else "")
        )
        if rank == 0:
            warn(f"[checkpoint] WARNING: skipping damaged checkpoint {skipped[-1]}")
    if skipped:
        raise CannotContinue(
            f"no usable checkpoint left in {ckpt_dir}: every complete checkpoint failed verification:\n  "
            + "\n  ".join(skipped)
            + "\nRestore the files, or start over with checkpoint.resume=none (and another checkpoint.dir)."
        )
    return None


def _remote_candidates(ckpt_dir: Path, remote: str) -> list[tuple[str, bool]]:
    """Rank 0 lists the remote checkpoints whose COMPLETE exists, the remote `latest` first, then newest first,
    after any local complete checkpoint newer than all of them; every rank gets the same (tag, in bucket) list."""
    from core.storage import RunStore

    tags: list[tuple[str, bool]] = []
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        store = RunStore(ckpt_dir, remote)
        names = store.list_dir(ckpt_dir)
        up = [
            t
            for t in sorted(names, reverse=True)
            if TAG_RE.match(t) and store.exists(ckpt_dir / t / COMPLETE)
        ]
        if "latest" in names:
            latest = store.fs.cat_file(store.url(ckpt_dir / "latest")).decode().strip()
            if latest in up:
                up.remove(latest)
                up.insert(0, latest)
        newer = [t for t in complete_tags(ckpt_dir)[::-1] if t not in up and t > max(up, default="")]
        tags = [(t, False) for t in newer] + [(t, True) for t in up]
    if dist.is_available() and dist.is_initialized():
        box = [tags]
        dist.broadcast_object_list(box, src=0)
        tags = box[0]
    return tags


def fetch_checkpoint(ckpt_dir: Path, tag: str, remote: str, force: bool = False) -> None:
    """Rank 0 downloads a remote checkpoint folder into `ckpt_dir` (the staging folder every rank reads; missing
    or differently sized files, and COMPLETE, are fetched); the other ranks wait for it."""
    from core.storage import RunStore

    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        RunStore(ckpt_dir, remote).pull([ckpt_dir / tag], force=force)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def fetch_url(url: str, cache_root: Path) -> tuple[Path, str]:
    """A checkpoint given by URL (`s3://.../checkpoints/step00000100`): downloaded into
    `cache_root/<hash of its folder>/<tag>`; returns (local checkpoints folder, tag) to load like a local one."""
    parent, tag = url.rstrip("/").rsplit("/", 1)
    if not TAG_RE.match(tag):
        raise ValueError(f"{url}: not a checkpoint folder (stepNNNNNNNN)")
    local = Path(cache_root) / sha256_bytes(parent)[:12]
    fetch_checkpoint(local, tag, parent)
    return local, tag


def upload_checkpoint(
    ckpt_dir: Path, tag: str, remote: str, keep_last: int, warn=None, retries: int = 3
) -> bool:
    """Rank 0, after COMPLETE and `latest` are written locally: the folder's files, then COMPLETE, then `latest`
    (a remote COMPLETE never precedes the files it lists); remote checkpoints beyond `keep_last` are removed.
    A failed upload is retried, then reported: the local checkpoint stays usable and training goes on."""
    from core.storage import RunStore

    store = RunStore(ckpt_dir, remote)
    for attempt in range(retries):
        try:
            t0 = time.time()
            sent = store.push([ckpt_dir / tag, *[p for p in (ckpt_dir / RESOLVED_CONFIG,) if p.is_file()]])
            sent += store.push([ckpt_dir / "latest"])
            mb = sum(p.stat().st_size for p in sent) / 2**20
            (warn or log.info)(
                f"[checkpoint] uploaded {tag} to {store.url(ckpt_dir / tag)} ({len(sent)} files, {mb:.1f} MiB, "
                f"{time.time() - t0:.1f}s)"
            )
            remote_tags = sorted(t for t in store.list_dir(ckpt_dir) if TAG_RE.match(t))
            for old in remote_tags[:-keep_last]:
                store.remove(ckpt_dir / old)
            return True
        except (
            OSError,
            RuntimeError,
            ValueError,
        ) as e:  # network and backend errors (botocore wraps in OSError)
            if attempt == retries - 1:
                (warn or log.warning)(
                    f"[checkpoint] WARNING: uploading {ckpt_dir / tag} to {store.url(ckpt_dir / tag)} failed "
                    f"({type(e).__name__}: {e}); it stays local only, the next checkpoint uploads again"
                )
                return False
            time.sleep(2**attempt)
    return False


def find_resume_tag(ckpt_dir: Path) -> str | None:
    """The `latest` pointer if its folder is complete and verifies, else the newest complete folder that does."""
    return select_resume_tag(ckpt_dir)


def nonfinite_flags(engine) -> tuple[list[str], torch.Tensor]:
    """This rank's parameter names and, on the device, whether each holds a non-finite value (ZeRO-3: each rank
    checks its partition). No host read: the caller reduces the flags with its own agreement."""
    names, tensors = [], []
    for name, p in engine.module.named_parameters():
        t = getattr(p, "ds_tensor", None)
        t = p if t is None else t
        if t.numel():
            names.append(name)
            tensors.append(t.detach())
    if not tensors:
        return names, torch.zeros(0, dtype=torch.bool, device=engine.device)
    # the 1-norm of each tensor, in torch's multi-tensor kernels (what clip_grad_norm_ uses): NaN or inf exactly
    # where a value is (a finite tensor's sum of |w| overflows only past 3.4e38), a few launches instead of two per
    # parameter; the max-norm took 3x as long on CPU (10 ms of a 190 ms step at the demo's size)
    return names, ~torch.isfinite(torch.stack(torch._foreach_norm(tensors, 1)))


def _on_any_rank(flags: list[bool | torch.Tensor], device: torch.device | str) -> list[bool]:
    """Several agreements in one all-reduce and one host read: whether each flag (a bool, or a 0-d tensor left on
    the device) is set on any rank."""
    t = torch.stack([torch.as_tensor(f, device=device).to(torch.float32) for f in flags])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [v > 0 for v in t.tolist()]


def _any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    return _on_any_rank([flag], device)[0]


def _free_bytes(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _is_comm_error(err: BaseException) -> bool:
    """A collective failed (dead peer, timeout): not a write error; re-raised at once, never waited on again."""
    text = str(err).lower()
    return isinstance(err, getattr(dist, "DistError", ())) or any(
        w in text for w in ("gloo", "nccl", "timed out")
    )


def _is_disk_full(err: BaseException, free: int) -> bool:
    """ENOSPC, or torch's C++ writer's 'basic_ios::clear: iostream error' (no errno) with no space left."""
    return is_disk_full(err) or free < (4 << 20)


def _disk_full_message(folder: Path, ckpt_dir: Path, free: int) -> str:
    """A save that failed on a full disk, whether its files were written on the step or in the background."""
    return (
        f"saving checkpoint {folder} failed: the disk is full ({free / 2**20:.1f} MiB free on the filesystem of "
        f"{ckpt_dir}); free space or lower checkpoint.keep_last, then resume"
    )


def _abandon(folder: Path, ckpt_dir: Path, step: int, why: str, rank: int) -> CannotContinue:
    """Remove a checkpoint folder that will never be complete (all ranks call this together)."""
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    dist.barrier()
    last = complete_tags(ckpt_dir)
    return CannotContinue(
        f"{why}; step {step} was not checkpointed (partial folder {folder} removed); last good checkpoint: "
        + (f"{last[-1]} in {ckpt_dir} (left untouched)" if last else f"none in {ckpt_dir}")
    )


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


def _module_snapshot(engine, pending: list[tuple[Any, str]]) -> dict[str, Any] | None:
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


def _write_snapshots(inner: Any, snapshots: list[tuple[Any, str]]) -> list[Any]:
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
def _recovery_scripts_deferred(engine, writes: list[Any] | None) -> Iterator[None]:
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


def save_checkpoint(
    engine,
    ckpt_dir: Path,
    step: int,
    client_state: dict[str, Any],
    keep_last: int,
    before_complete=None,
    meta: dict[str, Any] | None = None,
    remote: str | None = None,
    async_save: bool = True,
    after_complete=None,
    writer: str = "thread",
) -> Path:
    """`before_complete(folder, weights)` runs on every rank after DeepSpeed's state is taken and before the folder
    is marked complete (the trainer's export-parity probe); `weights` is this rank's host snapshot of the module's
    state dict when an async save took one (`_module_snapshot`), else None. It may return its file (a `TorchFile`)
    or a function that writes it, which run with the deferred writes. With `async_save`, DeepSpeed's files are host
    snapshots (`SnapshotWrites`) written in the background with the RNG state and the probe, before the hashing,
    by the background thread or, with `writer="process"`, by this rank's writer process (`checkpoint_writer`). `meta`
    (e.g. the resolved config) is recorded in COMPLETE. Returns once the files are written (the rest finishes in the background, see
    `wait_for_save`; `async_save=False`: before returning); `after_complete()` runs on rank 0 after the upload
    (the trainer pushes a remote run's logs there). A folder is never marked complete when a write failed (a full disk is named, with
    the free space) or the weights are not finite: it is removed and the run stops (CannotContinue) naming the
    last good checkpoint."""
    wait_for_save()  # the previous save's background part: its COMPLETE before this one's files
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = engine.device  # NCCL reduces device tensors only
    tag = tag_for(step)
    folder = ckpt_dir / tag
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if not _unlink_if_link(folder) and folder.exists():  # a killed save at this step: never mix files
            shutil.rmtree(folder)
    # no barrier here: DeepSpeed's save opens with one, and no rank writes into the folder before it
    error: BaseException | None = None
    writes: list[Any] = []  # run in the background part, before hashing
    pending: list[tuple[Any, str]] = []
    own: list[Path] = []  # the files this rank writes: it hashes them once they are written
    if not isinstance(engine.checkpoint_engine, SnapshotWrites):
        engine.checkpoint_engine = SnapshotWrites(engine.checkpoint_engine)
    ds_writes = engine.checkpoint_engine
    ds_writes.defer = async_save
    ds_writes.take()  # nothing left from a failed save
    try:
        with _recovery_scripts_deferred(engine, writes if async_save else None):
            engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
        pending, paths = ds_writes.take()
        writes += _write_snapshots(ds_writes.inner, pending)
        own += [Path(x) for x in paths]
    except (
        OSError,
        RuntimeError,
    ) as e:  # a write failed before DeepSpeed's closing barrier: meet the others there
        if _is_comm_error(e):
            raise
        error = e
        dist.barrier()
    if error is None:
        try:
            rng_path = folder / f"rng_rank{rank:05d}.pt"
            writes.append(TorchFile(rng_path, rng_state()))
            own.append(rng_path)
        except (OSError, RuntimeError) as e:
            if _is_comm_error(e):
                raise
            error = e
    if not _any_rank(error is not None, dev) and before_complete is not None:
        try:
            later = before_complete(folder, _module_snapshot(engine, pending))  # none deferred: None
            if later is not None:
                writes.append(later)
        except (OSError, RuntimeError) as e:
            if _is_comm_error(e):
                raise
            error = e
    # the last write-error check and the finiteness check agree in one all-reduce; once it returns every rank has
    # passed here, so no barrier follows
    names, nonfinite = nonfinite_flags(engine)
    failed, any_nonfinite = _on_any_rank([error is not None, nonfinite.any()], dev)
    if failed:
        free = _free_bytes(ckpt_dir)
        mine = [f"rank {rank}: {type(error).__name__}: {error}".splitlines()[0][:300]] if error else []
        full = _any_rank(error is not None and _is_disk_full(error, free), dev)
        errors = _gather(mine)
        why = (
            _disk_full_message(folder, ckpt_dir, free)
            if full
            else f"saving checkpoint {folder} failed ({'; '.join(errors)}); "
            f"{free / 2**20:.1f} MiB free on the filesystem of {ckpt_dir}"
        )
        raise _abandon(folder, ckpt_dir, step, why, rank)
    if any_nonfinite:
        mine = [n for n, f in zip(names, nonfinite.tolist(), strict=True) if f]
        bad = sorted(set(_gather(mine)))
        raise _abandon(
            folder,
            ckpt_dir,
            step,
            f"the weights after step {step} are not finite ({len(bad)} tensors, e.g. {', '.join(bad[:3])})"
            "; lower optim.lr or check the data, then resume",
            rank,
        )
    info = {
        "step": step,
        "world_size": world,
        "time": time.time(),
        "zero_stage": engine.zero_optimization_stage(),
    }
    global _pending
    _pending = _Pending(tag, folder, dev, writes, own, writer == "process" and async_save)
    _pending.start(
        lambda p: _finish(
            p, ckpt_dir, step, rank, world, {**info, **(meta or {})}, keep_last, remote, after_complete
        )
    )
    if (
        not async_save
    ):  # the synchronous path (checkpoint.async_save: false): hashing and upload before returning
        wait_for_save()
    return folder


class _Pending:
    """A save whose files are written and whose finishing (hashes, COMPLETE, `latest`, pruning, upload) runs in a
    background thread. `local_done` is set once this rank's share is hashed and its done marker written (or that
    failed: `local_error`); `error` is rank 0's failure to mark the folder complete."""

    def __init__(
        self, tag: str, folder: Path, dev, writes: list[Any], own: list[Path], in_process: bool = False
    ) -> None:
        self.tag, self.folder, self.dev, self.writes, self.own = tag, folder, dev, writes, own
        self.in_process = in_process  # the files written and hashed by this rank's writer process
        self.local_done, self.abort = threading.Event(), threading.Event()
        self.local_error: BaseException | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self, work) -> None:
        def run() -> None:
            lowest_priority()
            try:
                with short_switch_interval():
                    work(self)
            except BaseException as e:  # noqa: BLE001  (recorded and raised at the next wait, never lost)
                log.error(
                    f"[checkpoint] finishing {self.tag} in the background failed: {type(e).__name__}: {e}"
                )
                if not self.local_done.is_set():
                    self.local_error = e
                else:
                    self.error = e
            finally:
                self.local_done.set()

        # a daemon: an exception in the loop ends the process without waiting (as a kill would: the previous
        # complete checkpoint stays `latest`)
        self.thread = threading.Thread(target=run, name=f"checkpoint-{self.tag}", daemon=True)
        self.thread.start()


_pending: _Pending | None = None
_writer: WriterProcess | None = None


@atexit.register
def _join_at_exit() -> None:
    """At an exit that did not wait for the save (an error ended the run): the background thread finishes the file
    it is writing before the interpreter stops it. torch.save calls back into Python for each write, and a daemon
    thread stopped inside that call crashes the process (a SIGSEGV instead of the run's own exit code). The save is
    abandoned (rank 0 stops waiting for the others: no COMPLETE, the previous checkpoint stays `latest`)."""
    p = _pending
    if p is not None and p.thread is not None and p.thread.is_alive():
        p.abort.set()
        p.thread.join(timeout=120)


def _writer_process() -> WriterProcess:
    global _writer
    if _writer is None:
        _writer = WriterProcess()
    return _writer


def start_writer() -> None:
    """Starts this rank's writer process ahead of the first save (`checkpoint.async_writer: process`)."""
    _writer_process().start()


def close_writer() -> None:
    """Ends this rank's writer process, if a save started one (the end of the run, after `wait_for_save`)."""
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None


def _marker(folder: Path, rank: int) -> Path:
    return folder / f"{HASHES_PREFIX}{rank:05d}.json"


def _finish(
    p: _Pending,
    ckpt_dir: Path,
    step: int,
    rank: int,
    world: int,
    meta: dict[str, Any],
    keep_last: int,
    remote: str | None,
    after_complete,
) -> None:
    """The background part of a save. Every rank hashes its share of the files and writes a done marker (its
    hashes); rank 0 waits for all markers, which is how the ranks agree that every file is written without a
    collective off the main thread (the checkpoint folder is shared by all ranks, as verification already
    requires), then writes COMPLETE, `latest`, prunes and uploads. A kill anywhere here leaves a folder without
    COMPLETE: the previous complete checkpoint stays `latest`."""
    folder = p.folder
    try:
        pause("write")
        # this rank's deferred files: DeepSpeed's snapshots, its RNG state, the probe (TorchFile), and what only
        # this process can write (another checkpoint engine's save, DeepSpeed's recovery scripts)
        deferred = [w for w in p.writes if isinstance(w, TorchFile)]
        for write in p.writes:
            if not isinstance(write, TorchFile):
                write()
        p.writes = []
        # the files this rank wrote (another rank's may not be written yet); rank 0 hashes what is left below
        names = sorted({str(f.relative_to(folder)) for f in p.own if folder in f.parents})
        if p.in_process:
            mine = _writer_process().write_and_hash(deferred, folder, names)
        else:
            mine = write_and_hash(deferred, folder, names)
        del deferred
        atomic_write(_marker(folder, rank), json.dumps(mine))
    except Exception as e:  # noqa: BLE001  (raised at the next wait, on every rank)
        p.local_error = e
        log.error(f"[checkpoint] writing or hashing {folder} failed on rank {rank}: {type(e).__name__}: {e}")
        return
    finally:
        p.local_done.set()
    if rank != 0:
        return
    markers = [_marker(folder, r) for r in range(world)]
    while not all(m.is_file() for m in markers):
        if p.abort.wait(0.02):  # another rank failed: the folder is never marked complete
            return
    try:
        files: dict[str, dict[str, Any]] = {}
        for m in markers:
            files.update(json.loads(m.read_text()))
            m.unlink()
        # every rank has written its files: whatever no rank hashed as its own (the probe) is hashed here
        files.update(file_entries(folder, [n for n in _checkpoint_files(folder) if n not in files]))
        write_complete(folder, meta, files)
        atomic_write(ckpt_dir / "latest", p.tag)
    except (OSError, ValueError) as e:
        p.error = e
        log.error(f"[checkpoint] writing {COMPLETE} of {folder} failed: {type(e).__name__}: {e}")
        return
    prune_checkpoints(ckpt_dir, keep_last)
    _remove_abandoned(ckpt_dir, step)
    if remote is not None:  # `remote`: the checkpoints folder of a remote run (run.output_dir is a URL)
        pause("upload")
        upload_checkpoint(ckpt_dir, p.tag, remote, keep_last)
    if after_complete is not None:
        after_complete()


def wait_for_save() -> None:
    """Wait for the previous save's background part (every rank together: the next save, the end of the run and
    a preemption exit call it). A failure on any rank stops the run on all of them (CannotContinue naming the
    checkpoint; its folder is removed, the previous complete checkpoint stays `latest`)."""
    global _pending
    p, _pending = _pending, None
    if p is None:
        return
    p.local_done.wait()
    assert p.thread is not None
    rank = dist.get_rank()
    # One all-reduce when rank 0 has finished marking the folder (the common case: a save interval is longer than
    # the background part); while it still waits for the others' markers, it learns first whether to stop waiting.
    rank0_done = rank != 0 or not p.thread.is_alive()
    failed, failed_rank0, rank0_busy = _on_any_rank(
        [p.local_error is not None, rank == 0 and rank0_done and p.error is not None, not rank0_done],
        p.dev,
    )
    if failed:
        p.abort.set()
    p.thread.join()
    if rank0_busy:
        failed = _any_rank(p.error is not None, p.dev) or failed
    else:
        failed = failed or failed_rank0
    if not failed:
        return
    err = p.local_error or p.error
    mine = [f"rank {rank}: {type(err).__name__}: {err}".splitlines()[0][:300]] if err else []
    errors = _gather(mine)
    ckpt_dir = p.folder.parent
    free = _free_bytes(ckpt_dir)
    full = _any_rank(err is not None and _is_disk_full(err, free), p.dev)
    if rank == 0 and not (p.folder / COMPLETE).is_file():  # never complete now: no partial folder is left
        shutil.rmtree(p.folder, ignore_errors=True)
    dist.barrier()
    last = complete_tags(ckpt_dir)
    why = (
        _disk_full_message(p.folder, ckpt_dir, free)
        if full
        else f"finishing checkpoint {p.tag} in the background failed ({'; '.join(errors)}); "
        f"{free / 2**20:.1f} MiB free on the filesystem of {ckpt_dir}"
    )
    raise CannotContinue(
        f"{why}; last good checkpoint: " + (f"{last[-1]} in {ckpt_dir}" if last else f"none in {ckpt_dir}")
    )


def prune_checkpoints(ckpt_dir: Path, keep_last: int) -> None:
    """Removes the complete checkpoints older than the newest `keep_last` (rank 0, after a save's COMPLETE)."""
    for old in complete_tags(ckpt_dir)[:-keep_last]:
        # COMPLETE first: a kill mid-removal leaves an incomplete folder, which the next save removes
        if not _unlink_if_link(ckpt_dir / old):
            (ckpt_dir / old / COMPLETE).unlink(missing_ok=True)
            shutil.rmtree(ckpt_dir / old, ignore_errors=True)
        universal = ckpt_dir / (old + UNIVERSAL_SUFFIX)
        if not _unlink_if_link(universal):
            shutil.rmtree(universal, ignore_errors=True)


def _unlink_if_link(path: Path) -> bool:
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


def _remove_abandoned(ckpt_dir: Path, step: int) -> None:
    """Step folders before `step` without COMPLETE can never complete (training is past them, and one run holds
    the folder): what a kill mid-save at a step off the `every_steps` grid (a SIGTERM save) or mid-removal of an
    old checkpoint left. The 20-kill soak found one (step 13 of a run saving every 2 steps) in a finished run. A
    link is removed alone, never followed (`_unlink_if_link`)."""
    for d in ckpt_dir.iterdir():
        m = TAG_RE.match(d.name)
        if m and int(m.group(1)) < step and d.is_dir() and not (d / COMPLETE).exists():
            if not _unlink_if_link(d):
                shutil.rmtree(d, ignore_errors=True)


UNIVERSAL_SUFFIX = "_universal"


def needs_universal(ckpt_dir: Path, tag: str, world_size: int) -> bool:
    """ZeRO shards are laid out per data-parallel rank: another world size must go through DeepSpeed's
    universal checkpoint (parameter-wise fp32 + optimizer fragments)."""
    meta = read_complete(ckpt_dir, tag)
    return meta["world_size"] != world_size and meta.get("zero_stage", 0) > 0


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """Rank 0 only: DeepSpeed's ds_to_universal into `<tag>_universal` (once; reused on later restarts)."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal

    out = ckpt_dir / (tag + UNIVERSAL_SUFFIX)
    if (out / COMPLETE).is_file() and not verify_files(out):
        return out.name
    if out.exists():
        shutil.rmtree(out)
    check_folder(ckpt_dir / tag)  # ds_to_universal unpickles every shard with weights_only=False
    args = argparse.Namespace(
        input_folder=str(ckpt_dir / tag),
        output_folder=str(out),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # transformers models carry no Megatron-style universal info; DeepSpeed adds it
    )
    ds_to_universal.main(args)
    for f in (ckpt_dir / tag).glob("rng_rank*.pt"):
        shutil.copy2(f, out / f.name)
    meta = {k: v for k, v in read_complete(ckpt_dir, tag).items() if k not in ("files", "manifest")}
    write_complete(out, meta, file_entries(out, _checkpoint_files(out)))
    return out.name


def tokenizer_identity(tokenizer_dir: Path, tokenizer_len: int) -> dict[str, Any]:
    """What a checkpoint records of its tokenizer (COMPLETE's `tokenizer`): a resume or export with another one
    is named in one line instead of torch's `size mismatch` for the embedding."""
    import hashlib

    tok_json = Path(tokenizer_dir) / "tokenizer.json"
    sha = hashlib.sha256(tok_json.read_bytes()).hexdigest() if tok_json.is_file() else None
    return {"path": str(tokenizer_dir), "sha256": sha, "size": int(tokenizer_len)}


def check_tokenizer(ckpt_dir: Path, tag: str, tokenizer_dir: Path, tokenizer_len: int) -> None:
    """CannotContinue when the tokenizer now in `tokenizer_dir` is not the one the checkpoint was trained with."""
    was = read_complete(ckpt_dir, tag).get("tokenizer")
    now = tokenizer_identity(tokenizer_dir, tokenizer_len)
    if was and (was.get("sha256") != now["sha256"] or was.get("size") != now["size"]):
        raise CannotContinue(
            f"tokenizer swapped: checkpoint {ckpt_dir / tag} was trained with a tokenizer of {was.get('size')} tokens "
            f"(sha256 {str(was.get('sha256'))[:12]}), {tokenizer_dir} now holds one of {now['size']} tokens (sha256 "
            f"{str(now['sha256'])[:12]}); restore the checkpoint's tokenizer or start a new output folder"
        )


def _unshare_step_counts(engine) -> None:
    """Give every parameter's optimizer state its own `step` tensor (issue 43). DeepSpeed 0.19.8's ZeRO-3
    universal load (`stage3.py` `load_hp_checkpoint_state_from_checkpoint_dir_stage3`) stores one tensor in
    every sub-group's state; torch's Adam increments it in place once per sub-group, so each step counted
    several times and the bias correction drifted from the uninterrupted run (DeepSpeed #6691)."""
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    seen: set[int] = set()
    for state in getattr(inner, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            if id(step) in seen:
                state["step"] = step.clone()
            seen.add(id(step))


def load_checkpoint(engine, ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """Restore engine (weights, optimizer, LR schedule) and this rank's RNG; return the client state. Every file
    of the folder is scanned first: DeepSpeed unpickles with weights_only=False (pretrain/safe_load.py)."""
    check_folder(ckpt_dir / tag)  # a resume, a universal checkpoint, a loss spike's rollback alike
    try:
        path, client_state = engine.load_checkpoint(
            str(ckpt_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
    except RuntimeError as e:  # a checkpoint without a tokenizer record, loaded into a model of another size
        if "size mismatch" not in str(e):
            raise
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e))
        raise CannotContinue(
            f"checkpoint {ckpt_dir / tag} does not fit the model built from the current "
            f"tokenizer and model settings (was the tokenizer swapped?): {first}"
        ) from None
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_dir / tag}")
    _unshare_step_counts(engine)
    rng_path = ckpt_dir / tag / f"rng_rank{dist.get_rank():05d}.pt"
    if read_complete(ckpt_dir, tag)["world_size"] == dist.get_world_size():
        # verification lists it; only a checkpoint older than the file list gets here
        if not rng_path.is_file():
            raise CannotContinue(f"{rng_path} is missing: the resume would not be exact")
        set_rng_state(load(rng_path))
    return client_state or {}
