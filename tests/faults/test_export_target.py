"""Issue 43 fault 1: `pretrain export --out X` refuses an X that exists and is not an export of ours (a user's
folder, the run's checkpoints, the run folder itself, a file), naming it, before any work; nothing in it is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.exit_codes import USAGE
from tests.pretrain.conftest import ROOT


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.timeout(60)
def test_export_refuses_a_target_that_is_not_one_of_ours(tmp_path, capsys):
    from pretrain.__main__ import main

    run = tmp_path / "run"
    (run / "checkpoints" / "step00000004").mkdir(parents=True)
    (run / "checkpoints" / "step00000004" / "COMPLETE").write_text(json.dumps({"step": 4}))
    (run / "checkpoints" / "latest").write_text("step00000004")
    victim = tmp_path / "victim"
    (victim / "other_model").mkdir(parents=True)
    (victim / "precious.txt").write_text("notes")
    (tmp_path / "a-file").write_text("mine")
    (run / "export").mkdir()
    (run / "export" / "notes.txt").write_text("not an export")  # the default target, made by the user
    before = _snapshot(tmp_path)
    base = ["export", "--config", str(ROOT / "configs" / "demo.yaml"), f"run.output_dir={run}"]
    for target in (victim, run / "checkpoints", run, tmp_path / "a-file", None):
        code = main([*base, *(["--out", str(target)] if target else [])])
        err = capsys.readouterr().err
        assert code == USAGE, (target, err)
        named = target or run / "export"
        assert f"{named} exists and is not an export" in err and len(err.strip().splitlines()) == 1, err
        assert _snapshot(tmp_path) == before, target
    assert not list(tmp_path.rglob(".*"))  # no staging folder made


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` read-only as an archived or snapshot run is: a read-only bind mount over itself as root (who
    writes through any mode bits), mode bits otherwise."""
    if os.geteuid() == 0:
        mount = subprocess.run(
            ["mount", "--bind", "-o", "ro", folder, folder], capture_output=True, text=True
        )
        if mount.returncode != 0:
            pytest.skip(f"cannot make a read-only bind mount here: {mount.stderr.strip()}")
        try:
            yield
        finally:
            subprocess.run(["umount", folder], check=True)
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
    for p in modes:
        p.chmod(0o555)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


@pytest.mark.timeout(60)
def test_export_of_a_read_only_run_without_out_is_one_line_naming_the_folder(tmp_path, capsys):
    """Issue 43 fault 3: without --out, an export of a read-only run was a raw OSError traceback."""
    from pretrain.__main__ import main

    run = tmp_path / "run"
    (run / "checkpoints" / "step00000004").mkdir(parents=True)
    (run / "checkpoints" / "step00000004" / "COMPLETE").write_text(json.dumps({"step": 4}))
    base = ["export", "--config", str(ROOT / "configs" / "demo.yaml"), f"run.output_dir={run}"]
    with read_only(run):
        code = main(base)
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert len(err.strip().splitlines()) == 1 and f"{run} is not writable" in err and "--out" in err, err


@pytest.mark.timeout(60)
def test_a_staging_name_beside_the_target_that_is_not_ours_is_refused_untouched(tmp_path, capsys):
    """Issue 64 item 4: the export is staged in `.<out>.staging` beside the target, and a folder of that name was
    removed as "left by a killed export" without a word, whoever made it; a link of that name gave a raw OSError.
    Only a staging folder that an export marked as its own is removed; anything else is refused, named."""
    from pretrain.__main__ import main

    run = tmp_path / "run"
    (run / "checkpoints" / "step00000004").mkdir(parents=True)
    (run / "checkpoints" / "step00000004" / "COMPLETE").write_text(json.dumps({"step": 4}))
    (run / "checkpoints" / "latest").write_text("step00000004")
    users = tmp_path / ".out.staging"
    users.mkdir()
    (users / "thesis.tex").write_text("mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.txt").write_text("mine too")
    (run / ".export.staging").symlink_to(elsewhere, target_is_directory=True)
    before = _snapshot(tmp_path)
    base = ["export", "--config", str(ROOT / "configs" / "demo.yaml"), f"run.output_dir={run}"]
    for args, staging in ((["--out", str(tmp_path / "out")], users), ([], run / ".export.staging")):
        code = main([*base, *args])
        err = capsys.readouterr().err
        assert code == USAGE, err
        assert f"{staging} exists and is not a staging folder of lmstack's" in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert _snapshot(tmp_path) == before
    assert (run / ".export.staging").is_symlink()
