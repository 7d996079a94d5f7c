"""transfer x a damaged or incomplete export, x SIGKILL and SIGTERM (issue 25, item 1).

An export folder changed since `pretrain export` wrote it (its weights no longer match the hash in its COMPLETE),
or one of ours without COMPLETE, is refused before any training: fine-tunes of other weights would be published
as this model's results. A plain Hugging Face folder (no COMPLETE, no training_state.json) is fine-tuned as
given. A killed transfer is redone: the previous transfer.json stays whole, nothing temporary is left, and the
rerun reports what an uninterrupted run reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapt.finetune import finetune
from adapt.report import RESULT_FILE
from adapt.transfer import run_transfer
from pretrain.checkpoint import COMPLETE
from pretrain.export.folder import ExportMismatchError, verify_export, weights_hash
from tests.adapt.test_finetune import _export, _labelled_folder, _labelled_rows, _task_cfg
from tests.pretrain.conftest import ROOT, child_env

PRESET = "roberta-tiny"


def _completed_export(tmp_path: Path) -> tuple[Path, list[str], Path]:
    """A tiny export with the COMPLETE that `pretrain export` writes last; its overrides; a labelled folder."""
    rows = _labelled_rows(per_label=12, chars=300)
    export, overrides = _export(tmp_path, PRESET, [r[1] for r in rows])
    (export / "training_state.json").write_text(json.dumps({"step": 7}))
    (export / COMPLETE).write_text(json.dumps({"step": 7, "weights_sha256": weights_hash(export)}))
    return export, overrides, _labelled_folder(tmp_path, rows)


def _flip_a_weight_byte(export: Path) -> None:
    f = export / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-9] ^= 0xFF  # in the tensor data, past the JSON header: the file still loads
    f.write_bytes(bytes(data))


@pytest.mark.timeout(120)
def test_an_export_changed_since_it_was_written_is_refused_before_any_training(tmp_path):
    export, overrides, folder = _completed_export(tmp_path)
    cfg = _task_cfg(PRESET, overrides, train=str(folder))
    verify_export(export)  # as written: accepted
    previous = b'{"weights_sha256": "earlier"}'
    (export / RESULT_FILE).write_bytes(previous)
    _flip_a_weight_byte(export)
    msg = r"weights \(model\.safetensors\) differ from what `pretrain export` wrote at step 7 .*export again"
    with pytest.raises(ExportMismatchError, match=msg):
        run_transfer(cfg, export, tmp_path / "tr", log=lambda *_: None)
    with pytest.raises(ExportMismatchError, match=msg):
        finetune(cfg, export, "pretrained", tmp_path / "ft", log=lambda *_: None)
    assert not (tmp_path / "tr").exists() and not (tmp_path / "ft").exists()  # refused before any work
    assert (export / RESULT_FILE).read_bytes() == previous

    # One of our exports without its COMPLETE (copied while being written, or by hand): refused, named.
    (export / COMPLETE).unlink()
    with pytest.raises(ExportMismatchError, match=rf"{export}: an incomplete export \(no {COMPLETE},"):
        run_transfer(cfg, export, tmp_path / "tr", log=lambda *_: None)
    # A plain Hugging Face folder (none of our files): fine-tuned as given.
    (export / "training_state.json").unlink()
    verify_export(export)


def _transfer_cmd(export: Path, overrides: list[str], folder: Path, out: Path) -> list[str]:
    task = "finetune.tasks=[{name: t, train: " + json.dumps(str(folder)) + "}]"
    return [
        sys.executable,
        "-m",
        "adapt",
        "transfer",
        "--config",
        f"configs/{PRESET}.yaml",
        "--model",
        str(export),
        "--out",
        str(out),
        *overrides,
        "finetune.seeds=[0,1]",
        task,
    ]


def _results(report: dict) -> dict:
    """The report without what differs between two identical runs (durations, the output folder)."""

    def strip(x: object) -> object:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "model")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip(report)


def _temporary(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.name.startswith(".") or ".tmp" in p.name]


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_transfer_keeps_the_previous_report_and_the_rerun_reports_the_same(tmp_path, sig):
    export, overrides, folder = _completed_export(tmp_path)
    out = tmp_path / "tr"
    cmd = _transfer_cmd(export, overrides, folder, out)
    env = child_env()
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-4000:]
    reference = (export / RESULT_FILE).read_bytes()

    # Killed once the first fine-tune has written its result: some work done, the report not yet written.
    for stale in out.rglob("result.json"):
        stale.unlink()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 300
    while proc.poll() is None and not list(out.rglob("result.json")) and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the transfer ended before its kill"
    os.killpg(proc.pid, sig)
    assert proc.wait(timeout=60) == -sig
    assert (export / RESULT_FILE).read_bytes() == reference  # whole, and the previous one
    assert (out / RESULT_FILE).read_bytes() == reference
    assert _temporary(export) == [] and _temporary(out) == []

    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert _results(json.loads((export / RESULT_FILE).read_text())) == _results(json.loads(reference))
