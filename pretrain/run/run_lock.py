"""One training run per output folder.

Two runs on one folder overwrite each other's checkpoints and metrics and both exit 0. Rank 0 therefore takes
`<folder>/train.lock` (created exclusively; it records host, pid and the process start time) before any work.
A lock left by a dead process on this host (no such pid, or the pid now belongs to a process started later) is
stale and taken over; a lock from another host cannot be checked from here and is reported with its holder.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from core.errors import CannotContinueError

LOCK_NAME = "train.lock"


class RunFolderLocked(CannotContinueError):
    pass


def process_start_time(pid: int) -> float | None:
    """Start time of a live process (seconds since boot, from /proc), None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return -1.0  # alive, start time unknown (no /proc)


def _holder_alive(info: dict[str, Any]) -> bool:
    started = process_start_time(int(info.get("pid", -1)))
    if started is None:
        return False
    recorded = info.get("proc_start")
    return started < 0 or recorded is None or abs(started - recorded) < 1.0  # else: the pid was reused


class RunLock:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_NAME
        self.held = False

    def _me(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "proc_start": process_start_time(os.getpid()),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "time": time.time(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
        }

    def _stale(self, info: dict[str, Any] | None) -> bool:
        """A dead process on this host, or an earlier incarnation of this Slurm job (requeued after a crash,
        perhaps on another node); an unreadable lock older than a minute (killed while writing it)."""
        if info is None:
            try:
                return time.time() - self.path.stat().st_mtime > 60
            except OSError:
                return True
        job = os.environ.get("SLURM_JOB_ID")
        if job and info.get("slurm_job") == job:
            return True
        return info.get("host") == socket.gethostname() and not _holder_alive(info)

    def acquire(self) -> str | None:
        """Take the lock; returns a note when a stale lock was taken over. RunFolderLocked if it is held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        note = None
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self._read()
                holder = (
                    f"host {info.get('host')} pid {info.get('pid')} since {info.get('started')}"
                    if info
                    else "an unreadable lock file"
                )
                if self._stale(info):
                    note = f"[train] took over a stale lock {self.path} (from {holder}, no longer running)"
                    self.path.unlink(missing_ok=True)
                    continue
                where = (
                    ""
                    if not info or info.get("host") == socket.gethostname()
                    else (" on another host (its process cannot be checked from here)")
                )
                raise RunFolderLocked(
                    f"{self.path.parent} is in use by another training run: {holder}{where}. Two runs on one "
                    f"folder would overwrite each other's checkpoints. Use another run.output_dir, or, if that run "
                    f"is dead, delete {self.path}."
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(self._me(), f)
            self.held = True
            return note
        raise RunFolderLocked(f"could not take {self.path}: it keeps reappearing")

    def _read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.held:
            info = self._read()
            if info and info.get("pid") == os.getpid() and info.get("host") == socket.gethostname():
                self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
