"""A cached side venv for tools that must not share the main environment (the oldest supported transformers for
the export-compatibility test, datatrove for the peer benchmarks).

Built once and reused while its recorded requirements match and its probe imports; an exclusive file lock makes
concurrent callers (pytest-xdist workers, two benchmarks) wait for one build instead of running pip into the same
folder at once.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


def _probe_ok(python: Path, probe: str | None) -> bool:
    if not python.exists():
        return False
    return probe is None or subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def ensure_venv(
    path: Path, requirements: list[str], probe: str | None = None, timeout: int = 1800, layered: bool = False
) -> Path:
    """The venv's python, building `path` with `requirements` (pip specs) when missing, changed or failing `probe`.

    On a CPU-only machine put `torch==<version>` first in `requirements` when anything in them depends on torch,
    else pip resolves the CUDA build. `layered`: the venv also sees this interpreter's packages (a .pth file
    appends its site-packages after the venv's own), so pip installs only what is missing there and the venv's own
    versions win; pip never uninstalls from the base ("outside environment"). Raises RuntimeError naming the venv
    when pip or the probe fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    python = path / "bin" / "python"
    stamp = path / ".installed"
    want = json.dumps(
        {"requirements": requirements, "layered_on": sysconfig.get_paths()["purelib"]}
        if layered
        else requirements
    )
    with open(path.parent / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if stamp.is_file() and stamp.read_text() == want and _probe_ok(python, probe):
            return python
        log = ""
        if path.exists():
            log = (path / "builds.log").read_text() if (path / "builds.log").is_file() else ""
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
        if layered:
            own = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            (Path(own) / "_layered_on_base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        if requirements:
            res = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", *requirements],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if res.returncode != 0:
                raise RuntimeError(
                    f"could not build {path} with {requirements}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
                )
        (path / "builds.log").write_text(f"{log}built {time.strftime('%Y-%m-%dT%H:%M:%S')} {want}\n")
        if not _probe_ok(python, probe):
            raise RuntimeError(f"{path}: built with {requirements}, but `{probe}` fails in it")
        stamp.write_text(want)
        return python
