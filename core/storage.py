"""A remote run folder (`run.output_dir: s3://bucket/prefix`, `gs://...`, `memory://...`): a local staging
folder plus fsspec uploads and downloads, as MosaicML streaming's `MDSWriter(out=(local, remote))` and
llm-foundry's remote uploader do.

Every stage keeps writing into a local folder (`run.local_dir`: token shards are memory-mapped, DeepSpeed writes
checkpoints to a filesystem); a finished task uploads its files and then its completion marker, so a remote
marker never exists before the data it certifies. A restarted run, or a run on another node, trusts a task only
when its marker exists remotely: `pull(..., prune_markers=True)` brings the remote files into the local folder
and removes local markers the remote lacks. A URL is never turned into a local path: the local folder is
`RunConfig.run.root`, and `url()` maps a path inside it to the remote object.

A downloaded or uploaded file takes the remote object's modification time, so fingerprints that include input
mtimes (dedup, tokenize) agree between the node that wrote a file and the nodes that downloaded it.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.io import atomic_path
from core.layout import TOKEN_MANIFEST
from core.log import get_logger
from core.paths import filesystem

log = get_logger(__name__)

# Files that certify others: uploaded after the files they certify; a local one the remote lacks is not trusted.
MARKER_NAMES = {"COMPLETE", "_DONE.json", TOKEN_MANIFEST, "tokenizer.json"}
LAST_NAMES = {"latest"}  # pointers: after every marker


def is_marker(name: str) -> bool:
    """A stage's completion marker: `*.done` (clean, dedup shards, task markers), a token shard's
    `shard-XXXXX.json`, a checkpoint's COMPLETE, a stage's _DONE.json or manifest, `latest`."""
    return (
        name.endswith(".done")
        or name in MARKER_NAMES
        or name in LAST_NAMES
        or (name.startswith("shard-") and name.endswith(".json"))
    )


def _skipped(name: str) -> bool:
    """Never uploaded: temporary files of atomic writes, write probes, the run lock."""
    return name.startswith(".") or ".tmp" in name or name.endswith(".lock")


def _mtime(info: dict[str, Any]) -> float | None:
    for key in ("LastModified", "mtime", "modified", "updated", "created"):
        v = info.get(key)
        if isinstance(v, _dt.datetime):
            return (v if v.tzinfo else v.replace(tzinfo=_dt.timezone.utc)).timestamp()
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                return _dt.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


@dataclass(frozen=True)
class RunStore:
    """A local folder and the remote URL it mirrors (`remote` None: a local run; every call is a no-op).
    Plain strings and paths only: it is pickled into process-pool and Ray workers."""

    local: Path
    remote: str | None = None

    @classmethod
    def from_config(cls, cfg) -> RunStore:
        return cls(Path(cfg.run.root), cfg.run.output_dir.rstrip("/") if cfg.run.is_remote else None)

    @property
    def fs(self):
        return filesystem(self.remote)  # fsspec caches instances (per process: safe after fork)

    def _fresh_fs(self):
        """The filesystem with its listing cache dropped: other processes and nodes upload meanwhile."""
        fs = self.fs
        fs.invalidate_cache()
        return fs

    def url(self, path: str | os.PathLike[str]) -> str:
        rel = Path(path).relative_to(self.local).as_posix()
        return self.remote if rel == "." else f"{self.remote}/{rel}"

    def _bare(self, path: str | os.PathLike[str]) -> str:
        return self.fs._strip_protocol(self.url(path)).rstrip("/")

    # -- probes ------------------------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Write and delete a probe object (a missing bucket, bad credentials or endpoint fail here)."""
        probe = f"{self.remote}/.write-test-{os.getpid()}"
        self.fs.pipe_file(probe, b"ok")
        self.fs.rm_file(probe)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.remote is not None and self._fresh_fs().exists(self.url(path))

    def remove(self, path: str | os.PathLike[str]) -> None:
        if self.remote is None:
            return
        try:
            self.fs.rm(self.url(path), recursive=True)
        except FileNotFoundError:
            pass

    def list_dir(self, path: str | os.PathLike[str]) -> list[str]:
        """Names directly under a remote folder (empty when it does not exist)."""
        if self.remote is None:
            return []
        try:
            return sorted(
                p.rstrip("/").rsplit("/", 1)[-1] for p in self._fresh_fs().ls(self.url(path), detail=False)
            )
        except FileNotFoundError:
            return []

    # -- upload --------------------------------------------------------------------------------------------------

    def _put(self, f: Path) -> None:
        url = self.url(f)
        self.fs.put_file(str(f), url)
        t = _mtime(self.fs.info(url))
        if t is not None:
            os.utime(f, (t, t))

    def push(self, paths: Iterable[str | os.PathLike[str]], since: float | None = None) -> list[Path]:
        """Upload files (a folder: every file in it, or those modified at or after `since`). Data first, then
        markers, `latest` last; a marker's own files (`shard-00001.done` certifies `shard-00001.*`) go before
        it even when another task of the same pool wrote them earlier. Returns what was uploaded, in order."""
        if self.remote is None:
            return []
        files: list[Path] = []
        for p in map(Path, paths):
            if p.is_dir():
                files += sorted(
                    f
                    for f in p.rglob("*")
                    if f.is_file() and not _skipped(f.name) and (since is None or f.stat().st_mtime >= since)
                )
            elif p.is_file():
                files.append(p)
        markers = [f for f in files if is_marker(f.name)]
        data = [f for f in files if not is_marker(f.name)]
        for m in markers:
            stem = m.name.split(".")[0]
            data += sorted(
                f
                for f in m.parent.glob(f"{stem}.*")
                if f.is_file() and not is_marker(f.name) and not _skipped(f.name)
            )
        order = list(dict.fromkeys(data)) + sorted(dict.fromkeys(markers), key=lambda f: f.name in LAST_NAMES)
        for f in order:
            self._put(f)
        return order

    def push_or_warn(self, paths: Iterable[str | os.PathLike[str]], warn=None) -> bool:
        """push(), a failure reported instead of raised (logs, plots: the work goes on, the next push retries)."""
        try:
            self.push(paths)
            return True
        except (OSError, RuntimeError, ValueError) as e:  # network and backend errors (botocore: OSError)
            (warn or log.warning)(
                f"[storage] WARNING: uploading to {self.remote} failed ({type(e).__name__}: {e}); kept locally"
            )
            return False

    # -- download -----------------------------------------------------------------------------------------------

    def _get(self, bare: str, local: Path, info: dict[str, Any]) -> None:
        # atomic: two ranks fetching the same file never read a partial one
        with atomic_path(local) as tmp:
            self.fs.get_file(bare, str(tmp))
            t = _mtime(info)
            if t is not None:
                os.utime(tmp, (t, t))

    def pull(
        self,
        paths: Iterable[str | os.PathLike[str]],
        exclude: tuple[str, ...] = (),
        prune_markers: bool = False,
        only_markers: bool = False,
        force: bool = False,
    ) -> list[Path]:
        """Download the remote files under each local path (a folder or a file) that are missing here or differ
        in size (markers: always). `exclude`: folder names to leave out. `prune_markers`: delete local markers
        the remote lacks (a task finished here whose upload did not finish is not done). `only_markers`: fetch
        nothing else (a report that reads markers). `force`: fetch every file again. Returns the files fetched."""
        if self.remote is None:
            return []
        got = []
        fs = self._fresh_fs()
        for p in map(Path, paths):
            base = self._bare(p)
            try:
                listing = fs.find(base, detail=True, withdirs=False)
            except FileNotFoundError:
                listing = {}
            remote_files = set()
            for bare, info in listing.items():
                bare = bare.rstrip("/")
                if "size" not in info:  # find() of a single file gives no details
                    info = self.fs.info(bare)
                rel = bare[len(base) :].lstrip("/")
                parts = rel.split("/") if rel else []
                if info.get("type") == "directory" or any(x in exclude for x in parts[:-1]):
                    continue
                local = p.joinpath(*parts)
                if parts and _skipped(parts[-1]):
                    continue
                remote_files.add(local)
                if only_markers and not is_marker(local.name):
                    continue
                if (
                    not force
                    and not is_marker(local.name)
                    and local.is_file()
                    and local.stat().st_size == info.get("size")
                ):
                    continue
                self._get(bare, local, info)
                got.append(local)
            if prune_markers and p.is_dir():
                for f in p.rglob("*"):
                    if (
                        f.is_file()
                        and is_marker(f.name)
                        and f not in remote_files
                        and not any(x in exclude for x in f.relative_to(p).parts[:-1])
                    ):
                        f.unlink()
        return got

    def confirm(self, marker: Path, outputs: Iterable[Path] = ()) -> bool:
        """One task's done test on a remote run: its marker exists remotely. Then its outputs and the marker are
        fetched (when missing here) and True returned; else a local copy of the marker is removed."""
        if self.remote is None:
            return marker.exists()
        if not self.exists(marker):
            marker.unlink(missing_ok=True)
            return False
        self.pull([*outputs, marker])
        return True
