"""Slow storage for a checkpoint's background phases, seen from outside the product (issue 65, item 2).

A test kills a run while an async save is being written, hashed or uploaded, and a bench stands in for a slow
network; on this machine's small checkpoints each phase lasts milliseconds. This plug-in makes the storage slow
instead of asking the product to pause: an audit hook (`sys.addaudithook`) sees every `open()` a process makes and,
the first time a save's background thread (any thread but the main one) reaches a phase of a checkpoint folder
(`.../stepNNNNNNNN/`), sleeps that phase's seconds before the open goes ahead:

- `write`: the first file opened for writing in the folder (DeepSpeed's snapshots, the RNG state, the probe), or
  beside it while it is not complete (DeepSpeed's recovery scripts in the checkpoints folder);
- `hash`: this rank's done marker (`hashes.rankNNNNN.json`), opened once the rank's files are written and hashed;
- `upload`: the first file of the folder read once its COMPLETE exists (a remote run's upload reads it).

Installed by `tests/plugins/site/sitecustomize.py` in every process started with that folder on PYTHONPATH and
`SLOW_DISK_ENV` set (`"write=4"`, `"hash=0.5,upload=6"`), or in-process with `install(spec)`.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

SLOW_DISK_ENV = "LMSTACK_TEST_SLOW_DISK"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
PHASES = ("write", "hash", "upload")
_FOLDER = re.compile(r"^(.*/step\d{8})/(?:.*/)?([^/]+)$")
_TAG = re.compile(r"^step\d{8}$")


def parse(spec: str) -> dict[str, float]:
    """`"hash=2,upload=5"` -> {"hash": 2.0, "upload": 5.0}; a phase it does not know is refused, naming it."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, secs = part.partition("=")
        if name.strip() not in PHASES:
            raise ValueError(f"{SLOW_DISK_ENV}={spec!r}: {name.strip()!r} is not one of {', '.join(PHASES)}")
        out[name.strip()] = float(secs)
    return out


def _saving(parent: str) -> str | None:
    """The step folder of `parent` (a checkpoints folder) that is not complete yet: the save in flight."""
    try:
        names = [n for n in os.listdir(parent) if _TAG.match(n)]
    except OSError:
        return None
    open_ = [n for n in names if not os.path.exists(os.path.join(parent, n, "COMPLETE"))]
    return os.path.join(parent, max(open_)) if open_ else None


def _phase(path: str, mode: str) -> tuple[str, str] | None:
    """(checkpoint folder, phase) of an open, or None when it is no background phase of a checkpoint."""
    m = _FOLDER.match(path)
    if (
        m is None
    ):  # beside the step folders (DeepSpeed's recovery scripts): the write phase of the save in flight
        saving = _saving(os.path.dirname(path)) if any(c in mode for c in "wax+") else None
        return (saving, "write") if saving is not None else None
    folder, name = m.groups()
    # the marker is written atomically: its temporary file (".hashes.rankNNNNN.json.XXXX.tmp") is what opens first
    if name.lstrip(".").startswith("hashes.rank") and "w" in mode:
        return folder, "hash"
    if any(c in mode for c in "wax+"):
        return folder, "write"
    if os.path.exists(os.path.join(folder, "COMPLETE")):
        return folder, "upload"
    return None


def install(spec: str) -> None:
    """Slows this process's background phases by `spec`'s seconds, once per checkpoint folder and phase."""
    delays = parse(spec)
    done: set[tuple[str, str]] = set()
    main = threading.main_thread()

    def hook(event: str, args: tuple) -> None:
        if event != "open" or threading.current_thread() is main:
            return
        path, mode, flags = args
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(path, str):  # a file descriptor or bytes: no checkpoint file of ours
            return
        if mode is None:  # os.open: the flags say whether it writes
            mode = "w" if flags & (os.O_WRONLY | os.O_RDWR) else "r"
        hit = _phase(os.path.abspath(path), str(mode))
        if hit is not None and hit[1] in delays and hit not in done:
            done.add(hit)
            time.sleep(delays[hit[1]])

    sys.addaudithook(hook)


def env(spec: str, base: dict[str, str]) -> dict[str, str]:
    """`base` (a child's environment) with this plug-in installed into the processes it starts."""
    path = [SITE, *filter(None, base.get("PYTHONPATH", "").split(os.pathsep))]
    return {**base, "PYTHONPATH": os.pathsep.join(path), SLOW_DISK_ENV: spec}
