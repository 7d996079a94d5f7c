"""Issue 43 fault 7: a full disk under tokenize reported the free space of the run folder's filesystem, not of
tokens/ (another filesystem here: a link to tmpfs), where the write failed."""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

import pytest

from data_pipeline.__main__ import _disk_full_message
from runconfig import load_config

SHM = Path("/dev/shm")


@pytest.mark.skipif(not SHM.is_dir(), reason="needs a second filesystem (/dev/shm)")
def test_full_disk_names_the_free_space_where_the_write_failed(tmp_path):
    other = Path(__import__("tempfile").mkdtemp(dir=SHM))
    try:
        run = tmp_path / "run"
        run.mkdir()
        (run / "tokens").symlink_to(other)
        cfg = load_config("configs/demo.yaml", [f"run.output_dir={run}"])
        here, there = shutil.disk_usage(run).free, shutil.disk_usage(other).free
        assert abs(here - there) > 2**30, "the two filesystems should differ in free space for this test"
        for e in (OSError(errno.ENOSPC, "No space left on device", str(run / "tokens" / "bbc-00000.bin")),
                  OSError(errno.ENOSPC, "No space left on device")):  # fmt: skip
            msg = _disk_full_message("tokenize", cfg, e)
            mib = float(re.search(r"\(([\d.]+) MiB free on the filesystem of ([^)]+)\)", msg).group(1))
            assert abs(mib * 2**20 - there) < 2**20 * 64, msg
            assert f"filesystem of {run / 'tokens'}" in msg, msg
    finally:
        shutil.rmtree(other)
