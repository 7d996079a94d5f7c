"""transfer x full disk (issue 25, item 1): writing `transfer.json` on a full disk fails with one line that says
the disk is full (DiskFullError, exit 65) and leaves the previous report whole, in the export and in the output
folder (it is written atomically: a truncated report would drop results from the card, or break `pretrain card`)."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from adapt.report import RESULT_FILE, write_report
from core.errors import DiskFullError
from core.exit_codes import CANNOT_CONTINUE

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (needs root)"),
]


def test_a_report_that_does_not_fit_keeps_the_previous_one(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        export, out = small / "export", small / "finetune"
        export.mkdir()
        out.mkdir()
        old = {"model": str(export), "weights_sha256": "a" * 64, "tasks": {"bbc": {"accuracy": 0.9}}}
        write_report(old, [out, export])
        # fill the disk but for one page: the new report (about 20 KiB) cannot fit
        filler = small / "filler"
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        os.truncate(filler, filler.stat().st_size - 3 * 4096)
        new = {**old, "tasks": {f"task{i}": {"accuracy": i / 1000, "note": "x" * 200} for i in range(100)}}
        with pytest.raises(
            DiskFullError, match="the disk is full .* the previous report there is left whole"
        ) as err:
            write_report(new, [out, export])
        assert err.value.exit_code == CANNOT_CONTINUE and err.value.__cause__.errno == errno.ENOSPC
        for folder in (out, export):
            assert json.loads((folder / RESULT_FILE).read_text()) == old
            assert sorted(p.name for p in folder.iterdir()) == [RESULT_FILE]  # no temporary file left
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
