"""One save, killable at any moment.

DeepSpeed's own `latest` file is written by rank 0 without waiting for the other ranks' ZeRO shards, and its
files are written in place: a kill mid-save can leave `latest` pointing at a half-written folder. So we save with
`save_latest=False`, have every rank write its RNG state, and only once every rank's files are written and hashed
rank 0 writes `COMPLETE` in the tag folder and atomically replaces `latest`. Resume only ever considers folders
holding `COMPLETE` (verify.py). Weights that are not finite are never marked complete.

With `checkpoint.async_mode: async` (the default) `save_checkpoint` returns once every rank's state is in host
memory (staging.py); writing, hashing, COMPLETE, `latest`, pruning and a remote run's upload run in a background
thread (`PendingSave`). Ranks agree that all files are written through per-rank done markers in the folder, not a
collective off the main thread; the next save and the end of the run wait (`PendingSave.wait`) and stop every
rank on a background failure. Since COMPLETE and `latest` still come last, a kill at any moment leaves the
previous complete checkpoint as `latest`.
"""

from __future__ import annotations

import atexit
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from core.errors import CannotContinueError
from core.io import atomic_write
from core.log import get_logger
from pretrain.checkpoint.disk import disk_full, disk_full_message, free_bytes
from pretrain.checkpoint.meta import COMPLETE, complete_tags, tag_for
from pretrain.checkpoint.nonfinite import nonfinite_flags
from pretrain.checkpoint.prune import prune_checkpoints, remove_abandoned, unlink_if_link
from pretrain.checkpoint.ranks import any_rank, gather, is_comm_error, on_any_rank
from pretrain.checkpoint.remote import upload_checkpoint
from pretrain.checkpoint.rng import rng_state
from pretrain.checkpoint.staging import (
    SnapshotWrites,
    module_snapshot,
    recovery_scripts_deferred,
    write_snapshots,
)
from pretrain.checkpoint.verify import HASHES_PREFIX, checkpoint_files, write_complete
from pretrain.checkpoint.writer import (
    TorchFile,
    file_entries,
    lowest_priority,
    short_switch_interval,
    write_and_hash,
)

log = get_logger(__name__)


def _abandon(folder: Path, ckpt_dir: Path, step: int, why: str, rank: int) -> CannotContinueError:
    """Remove a checkpoint folder that will never be complete (all ranks call this together)."""
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    dist.barrier()
    last = complete_tags(ckpt_dir)
    return CannotContinueError(
        f"{why}; step {step} was not checkpointed (partial folder {folder} removed); last good checkpoint: "
        + (f"{last[-1]} in {ckpt_dir} (left untouched)" if last else f"none in {ckpt_dir}")
    )


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
) -> PendingSave:
    """`before_complete(folder, weights)` runs on every rank after DeepSpeed's state is taken and before the folder
    is marked complete (the trainer's export-parity probe); `weights` is this rank's host snapshot of the module's
    state dict when an async save took one (`module_snapshot`), else None. It may return its file (a `TorchFile`)
    or a function that writes it, which run with the deferred writes. With `async_save`, DeepSpeed's files are host
    snapshots (`SnapshotWrites`) written by the background thread with the RNG state and the probe, before the
    hashing. `meta` (e.g. the resolved config) is recorded in COMPLETE. Returns the save, whose background part
    finishes it (`PendingSave.wait`; `async_save=False`: finished before returning); `after_complete()` runs on
    rank 0 after the upload (the trainer pushes a remote run's logs there). The caller has waited for the previous
    save (CheckpointManager.save): its COMPLETE comes before this one's files. A folder is never marked complete
    when a write failed (a full disk is named, with the free space) or the weights are not finite: it is removed
    and the run stops (CannotContinueError) naming the last good checkpoint."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = engine.device  # NCCL reduces device tensors only
    tag = tag_for(step)
    folder = ckpt_dir / tag
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if not unlink_if_link(folder) and folder.exists():  # a killed save at this step: never mix files
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
        with recovery_scripts_deferred(engine, writes if async_save else None):
            engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
        pending, paths = ds_writes.take()
        writes += write_snapshots(ds_writes.inner, pending)
        own += [Path(x) for x in paths]
    except (
        OSError,
        RuntimeError,
    ) as e:  # a write failed before DeepSpeed's closing barrier: meet the others there
        if is_comm_error(e):
            raise
        error = e
        dist.barrier()
    if error is None:
        try:
            rng_path = folder / f"rng_rank{rank:05d}.pt"
            writes.append(TorchFile(rng_path, rng_state()))
            own.append(rng_path)
        except (OSError, RuntimeError) as e:
            if is_comm_error(e):
                raise
            error = e
    if not any_rank(error is not None, dev) and before_complete is not None:
        try:
            later = before_complete(folder, module_snapshot(engine, pending))  # none deferred: None
            if later is not None:
                writes.append(later)
        except (OSError, RuntimeError) as e:
            if is_comm_error(e):
                raise
            error = e
    # the last write-error check and the finiteness check agree in one all-reduce; once it returns every rank has
    # passed here, so no barrier follows
    names, nonfinite = nonfinite_flags(engine)
    failed, any_nonfinite = on_any_rank([error is not None, nonfinite.any()], dev)
    if failed:
        free = free_bytes(ckpt_dir)
        mine = [f"rank {rank}: {type(error).__name__}: {error}".splitlines()[0][:300]] if error else []
        full = any_rank(error is not None and disk_full(error, free), dev)
        errors = gather(mine)
        why = (
            disk_full_message(folder, ckpt_dir, free)
            if full
            else f"saving checkpoint {folder} failed ({'; '.join(errors)}); "
            f"{free / 2**20:.1f} MiB free on the filesystem of {ckpt_dir}"
        )
        raise _abandon(folder, ckpt_dir, step, why, rank)
    if any_nonfinite:
        mine = [n for n, f in zip(names, nonfinite.tolist(), strict=True) if f]
        bad = sorted(set(gather(mine)))
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
    save = PendingSave(tag, folder, dev, writes, own)
    save.start(
        lambda p: _finish(
            p, ckpt_dir, step, rank, world, {**info, **(meta or {})}, keep_last, remote, after_complete
        )
    )
    if not async_save:  # checkpoint.async_mode: disabled: hashing and upload before returning
        save.wait()
    return save


class PendingSave:
    """A save whose files are written and whose finishing (hashes, COMPLETE, `latest`, pruning, upload) runs in a
    background thread. `local_done` is set once this rank's share is hashed and its done marker written (or that
    failed: `local_error`); `error` is rank 0's failure to mark the folder complete. Held by the CheckpointManager
    until the next save, the end of the run or a stop waits for it: never a module global; an exit that does not
    wait abandons it (`abandon_at_exit`)."""

    def __init__(self, tag: str, folder: Path, dev, writes: list[Any], own: list[Path]) -> None:
        self.tag, self.folder, self.dev, self.writes, self.own = tag, folder, dev, writes, own
        self.local_done, self.abort = threading.Event(), threading.Event()
        self.local_error: BaseException | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.waited = False

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
        atexit.register(self.abandon_at_exit)  # until it is waited for
        self.thread.start()

    def abandon_at_exit(self) -> None:
        """At an exit that did not wait for the save (an error ended the run): the background thread finishes the
        file it is writing before the interpreter stops it. torch.save calls back into Python for each write, and
        a daemon thread stopped inside that call crashes the process (a SIGSEGV instead of the run's own exit
        code). The save is abandoned (rank 0 stops waiting for the others: no COMPLETE, the previous checkpoint
        stays `latest`)."""
        if self.thread is not None and self.thread.is_alive():
            self.abort.set()
            self.thread.join(timeout=120)

    def wait(self) -> None:
        """Wait for the background part (every rank together: the next save, the end of the run and a stop call
        it; a second call returns at once). A failure on any rank stops the run on all of them
        (CannotContinueError naming the checkpoint; its folder is removed, the previous complete checkpoint stays
        `latest`)."""
        if self.waited:
            return
        self.waited = True
        self.local_done.wait()
        assert self.thread is not None
        rank = dist.get_rank()
        # One all-reduce when rank 0 has finished marking the folder (the common case: a save interval is longer
        # than the background part); while it still waits for the others' markers, it learns first whether to
        # stop waiting.
        rank0_done = rank != 0 or not self.thread.is_alive()
        failed, failed_rank0, rank0_busy = on_any_rank(
            [
                self.local_error is not None,
                rank == 0 and rank0_done and self.error is not None,
                not rank0_done,
            ],
            self.dev,
        )
        if failed:
            self.abort.set()
        self.thread.join()
        atexit.unregister(self.abandon_at_exit)
        if rank0_busy:
            failed = any_rank(self.error is not None, self.dev) or failed
        else:
            failed = failed or failed_rank0
        if failed:
            raise self._failure(rank)

    def _failure(self, rank: int) -> CannotContinueError:
        """The one-line stop of a failed background part, alike on every rank (all ranks call it together)."""
        err = self.local_error or self.error
        mine = [f"rank {rank}: {type(err).__name__}: {err}".splitlines()[0][:300]] if err else []
        errors = gather(mine)
        ckpt_dir = self.folder.parent
        free = free_bytes(ckpt_dir)
        full = any_rank(err is not None and disk_full(err, free), self.dev)
        if (
            rank == 0 and not (self.folder / COMPLETE).is_file()
        ):  # never complete now: no partial folder is left
            shutil.rmtree(self.folder, ignore_errors=True)
        dist.barrier()
        last = complete_tags(ckpt_dir)
        why = (
            disk_full_message(self.folder, ckpt_dir, free)
            if full
            else f"finishing checkpoint {self.tag} in the background failed ({'; '.join(errors)}); "
            f"{free / 2**20:.1f} MiB free on the filesystem of {ckpt_dir}"
        )
        return CannotContinueError(
            f"{why}; last good checkpoint: "
            + (f"{last[-1]} in {ckpt_dir}" if last else f"none in {ckpt_dir}")
        )


def _marker(folder: Path, rank: int) -> Path:
    return folder / f"{HASHES_PREFIX}{rank:05d}.json"


def _finish(
    p: PendingSave,
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
        # this rank's deferred files: DeepSpeed's snapshots, its RNG state, the probe (TorchFile), and what only
        # this process can write (another checkpoint engine's save, DeepSpeed's recovery scripts)
        deferred = [w for w in p.writes if isinstance(w, TorchFile)]
        for write in p.writes:
            if not isinstance(write, TorchFile):
                write()
        p.writes = []
        # the files this rank wrote (another rank's may not be written yet); rank 0 hashes what is left below
        names = sorted({str(f.relative_to(folder)) for f in p.own if folder in f.parents})
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
        files.update(file_entries(folder, [n for n in checkpoint_files(folder) if n not in files]))
        write_complete(folder, meta, files)
        atomic_write(ckpt_dir / "latest", p.tag)
    except (OSError, ValueError) as e:
        p.error = e
        log.error(f"[checkpoint] writing {COMPLETE} of {folder} failed: {type(e).__name__}: {e}")
        return
    prune_checkpoints(ckpt_dir, keep_last)
    remove_abandoned(ckpt_dir, step)
    if remote is not None:  # `remote`: the checkpoints folder of a remote run (run.output_dir is a URL)
        upload_checkpoint(ckpt_dir, p.tag, remote, keep_last)
    if after_complete is not None:
        after_complete()
