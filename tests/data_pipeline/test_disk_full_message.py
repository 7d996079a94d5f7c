"""Issue 43 fault 7: a full disk under tokenize reported the free space of the run folder's filesystem, not of
tokens/ (another filesystem here: a link to tmpfs), where the write failed."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import pytest

from data_pipeline.__main__ import _disk_full_message
from runconfig import load_config

SHM = Path("/dev/shm")
TOLERANCE = 64 * 2**20  # other tests write while this one runs
APART = 4 * TOLERANCE


def _free_spaces_apart(here_dir: Path, there_dir: Path) -> tuple[int, int]:
    """Free bytes on both filesystems, at least APART apart. On a machine where they happen to be close (the CI
    machine on record: 485 MB), a ballast file on the second one makes them differ, so that the message's figure
    can only match the filesystem it names."""
    here, there = shutil.disk_usage(here_dir).free, shutil.disk_usage(there_dir).free
    if abs(here - there) < APART:
        fd = os.open(there_dir / "ballast", os.O_WRONLY | os.O_CREAT)
        try:
            os.posix_fallocate(fd, 0, 2 * APART)
        finally:
            os.close(fd)
        here, there = shutil.disk_usage(here_dir).free, shutil.disk_usage(there_dir).free
    assert abs(here - there) >= APART, f"free space {here} and {there} still too close"
    return here, there


@pytest.mark.skipif(not SHM.is_dir(), reason="needs a second filesystem (/dev/shm)")
def test_full_disk_names_the_free_space_where_the_write_failed(tmp_path):
    other = Path(__import__("tempfile").mkdtemp(dir=SHM))
    try:
        run = tmp_path / "run"
        run.mkdir()
        (run / "tokens").symlink_to(other)
        cfg = load_config("configs/demo.yaml", [f"run.output_dir={run}"])
        here, there = _free_spaces_apart(run, other)
        for e in (
            OSError(errno.ENOSPC, "No space left on device", str(run / "tokens" / "bbc-00000.bin")),
            OSError(errno.ENOSPC, "No space left on device"),
        ):
            msg = _disk_full_message("tokenize", cfg, e)
            mib = float(re.search(r"\(([\d.]+) MiB free on the filesystem of ([^)]+)\)", msg).group(1))
            assert abs(mib * 2**20 - there) < TOLERANCE, msg
            assert f"filesystem of {run / 'tokens'}" in msg, msg
    finally:
        shutil.rmtree(other)
