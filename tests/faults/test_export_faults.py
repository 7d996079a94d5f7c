"""Issue 25 rows 2 and 13 / item 3: an export is staged and renamed into place with a COMPLETE marker, carries
only results measured on its own weights (transfer.json is bound to the weight hash), and names the step it
took and why. A SIGKILL mid-export leaves the previous export whole."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.exit_codes import USAGE
from tests.faults.test_export_target import read_only
from tests.pretrain.conftest import ROOT, child_env, run_module

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed]


def _transfer(export: Path, accuracy: float) -> None:
    from pretrain.export.folder import weights_hash

    report = {
        "model": str(export),
        "weights_sha256": weights_hash(export),
        "tasks": {
            "bbc": {
                "task": "bbc",
                "margin": 0.1,
                "arms": {
                    "pretrained": {"test_accuracy": {"mean": accuracy, "sd": 0.0, "values": [accuracy]}},
                    "random": {"test_accuracy": {"mean": 0.2, "sd": 0.0, "values": [0.2]}},
                },
            }
        },
    }
    (export / "transfer.json").write_text(json.dumps(report))


@pytest.mark.timeout(780)
def test_export_is_staged_bound_to_its_weights_and_names_its_step(roberta_run, tmp_path):
    from pretrain.checkpoint import complete_tags
    from tests.pretrain.test_train_deepspeed import isolated

    out = isolated(roberta_run, tmp_path)
    run = Path(out.split("=", 1)[1])
    ckpts, export = run / "checkpoints", run / "export"
    base = [
        "--config",
        str(roberta_run),
        out,
        "checkpoint.every_steps=4",
        "checkpoint.keep_last=3",
        "eval.every_steps=1000",
        "schedule.total_steps=8",
    ]
    (run / "export.old").mkdir(parents=True)  # an earlier export the user renamed: never touched (issue 43)
    (run / "export.old" / "notes.txt").write_text("mine")
    umask = os.umask(0o022)  # the children inherit it: outputs must be 0644 (row 10)
    try:
        run_module(["-m", "pretrain", "train", *base])
        res = run_module(["-m", "pretrain", "export", *base])
    finally:
        os.umask(umask)
    assert complete_tags(ckpts) == ["step00000004", "step00000008"]
    for f in (
        ckpts / "step00000008" / "mp_rank_00_model_states.pt",
        ckpts / "step00000008" / "COMPLETE",
        export / "model.safetensors",
        export / "config.json",
        export / "COMPLETE",
    ):
        assert oct(f.stat().st_mode & 0o777) == "0o644", f
    assert "exporting step00000008: the newest complete checkpoint" in res.stderr
    done = json.loads((export / "COMPLETE").read_text())
    assert done["step"] == 8 and len(done["weights_sha256"]) == 64
    assert not list(run.glob(".export*"))  # no staging folder left
    _transfer(export, 0.777)
    run_module(["-m", "pretrain", "card", *base])
    assert "0.777" in (export / "README.md").read_text()

    # `latest` names a step whose COMPLETE never came: the export says so and takes the newest complete one;
    # the same weights again keep their results.
    shutil.copytree(ckpts / "step00000008", ckpts / "step00000012")
    (ckpts / "step00000012" / "COMPLETE").unlink()
    (ckpts / "latest").write_text("step00000012")
    res = run_module(["-m", "pretrain", "export", *base])
    assert "step00000012 is incomplete (no COMPLETE): exporting step00000008" in res.stderr
    assert "0.777" in (export / "README.md").read_text()

    # Other weights and a changed export setting into the same folder: the export is redone with the new
    # setting, and the earlier results are not carried over.
    assert "license: apache-2.0" in (export / "README.md").read_text()
    res = run_module(
        ["-m", "pretrain", "export", *base, "export.license=mit", "--checkpoint", str(ckpts / "step00000004")]
    )
    assert "exporting step00000004" in res.stderr
    assert json.loads((export / "COMPLETE").read_text())["step"] == 4
    assert "license: mit" in (export / "README.md").read_text()
    assert not (export / "transfer.json").exists() and "0.777" not in (export / "README.md").read_text()
    # A transfer.json measured on other weights, copied in by hand: `card` leaves it off, saying why.
    _transfer(export, 0.555)
    report = json.loads((export / "transfer.json").read_text())
    (export / "transfer.json").write_text(json.dumps(report | {"weights_sha256": "0" * 64}))
    res = run_module(["-m", "pretrain", "card", *base])
    assert "0.555" not in (export / "README.md").read_text() and "measured on other weights" in res.stderr

    # SIGKILL mid-export: the previous export stays whole; the next export clears the staging folder.
    before = {p.name: p.read_bytes() for p in export.iterdir() if p.is_file()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pretrain", "export", *base],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    staging = run / ".export.staging" / "export"
    deadline = time.monotonic() + 240
    while not (staging / "config.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the export finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert {p.name: p.read_bytes() for p in export.iterdir() if p.is_file()} == before
    run_module(["-m", "pretrain", "export", *base])
    assert (
        json.loads((export / "COMPLETE").read_text())["step"] == 8 and not (run / ".export.staging").exists()
    )
    assert (run / "export.old" / "notes.txt").read_text() == "mine"

    # A read-only run (archived, a snapshot): exported with --out elsewhere, its unwritable log said once and no
    # traceback; without --out, one line naming the folder (issue 43 fault 3).
    elsewhere = tmp_path / "elsewhere"
    with read_only(run):
        res = run_module(["-m", "pretrain", "export", *base, "--out", str(elsewhere)])
        refused = run_module(["-m", "pretrain", "export", *base], check=False)
    assert json.loads((elsewhere / "COMPLETE").read_text())["step"] == 8
    assert "Traceback" not in res.stderr and res.stderr.count("cannot write the log file") <= 1, res.stderr
    assert refused.returncode == USAGE and "Traceback" not in refused.stderr, refused.stderr
    assert f"{run} is not writable" in refused.stderr and "--out" in refused.stderr
