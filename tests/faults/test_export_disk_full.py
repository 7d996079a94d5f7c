"""export x full disk (issue 25, item 1): an export that runs out of space stops with one line naming the folder
and the free space (exit 65, as a checkpoint save does), removes its staging folder, and leaves the previous
export whole: same files, same weights, still COMPLETE."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pretrain.checkpoint import CANNOT_CONTINUE_EXIT_CODE, COMPLETE
from tests.pretrain.conftest import run_module
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed]


@pytest.mark.timeout(600)
def test_export_on_a_full_disk_is_named_and_keeps_the_previous_export(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    base = [
        "--config",
        str(roberta_run),
        out,
        "schedule.total_steps=2",
        "checkpoint.every_steps=2",
        "eval.every_steps=1000",
    ]
    run_module(["-m", "pretrain", "train", *base])  # one process: a world of one
    first = tmp_path / "first"
    run_module(["-m", "pretrain", "export", *base, "--out", str(first / "export")])
    size = sum(f.stat().st_size for f in (first / "export").iterdir())

    small = tmp_path / "small"
    small.mkdir()
    # room for one export and half of another: the second one's staging copy runs out of space
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size * 1.5) + (64 << 10)}", "tmpfs", str(small)],
        check=True,
    )
    try:
        run_module(["-m", "pretrain", "export", *base, "--out", str(small / "export")])
        before = {f.name: f.read_bytes() for f in (small / "export").iterdir()}
        res = run_module(["-m", "pretrain", "export", *base, "--out", str(small / "export")], check=False)
        assert res.returncode == CANNOT_CONTINUE_EXIT_CODE, res.stderr[-3000:]
        err = res.stderr.strip().splitlines()[-1]
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        assert f"exporting to {small / 'export'} failed: the disk is full" in err, err
        assert "MiB free on the filesystem of" in err and "the previous export is left whole" in err, err
        assert sorted(p.name for p in small.iterdir()) == ["export"]  # the staging folder is gone
        assert {f.name: f.read_bytes() for f in (small / "export").iterdir()} == before
        assert json.loads((small / "export" / COMPLETE).read_text())["step"] == 2
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    assert Path(first / "export" / "model.safetensors").is_file()
