"""`adapt continue` x SIGKILL (issue 64 item 7): the command killed while its continued run trains, then rerun,
resumes that run from its last checkpoint (no trainer left behind holding the folder, nothing mixed: the same
export, the same task text, the step count of one uninterrupted run); a continued/ folder that continues another
export is refused by name rather than resumed. Real DeepSpeed on CPU, one rank."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from adapt.continued import SOURCE_FILE, ContinuedRunMismatchError, continue_pretraining
from adapt.report import RESULT_FILE
from pretrain.checkpoint import complete_tags, tag_for
from tests.adapt.test_finetune import _export, _labelled_folder, _labelled_rows, _task_cfg
from tests.pretrain.conftest import ROOT, child_env

PRESET = "gpt2-tiny"
STEPS = 40  # tiny steps run ~20 a second: enough of them that a kill lands mid-run
QUICK = [
    "finetune.epochs=1",
    "finetune.seeds=[0]",
    "finetune.lr_grid=[1.0e-3]",
    "finetune.probe=false",
    "finetune.methods=[full]",
    "finetune.arms=[pretrained]",
    "batch.global_batch_size=8",
    "batch.micro_batch_size=4",
    "loader.num_workers=0",
    "checkpoint.every_steps=4",
    "eval.every_steps=100",
    "logging.every_steps=1",
]


def test_a_continued_folder_of_another_export_is_refused_not_resumed(tmp_path):
    rows = _labelled_rows(per_label=8, chars=200)
    folder = _labelled_folder(tmp_path, rows)
    export, overrides = _export(tmp_path, PRESET, [r[1] for r in rows])
    cfg = _task_cfg(PRESET, [*overrides, *QUICK], train=str(folder))
    root = Path(cfg.run.root) / "continued"
    root.mkdir(parents=True)
    (root / SOURCE_FILE).write_text(
        json.dumps({"export": str(export), "weights_sha256": "an-earlier-export", "task_text_sha256": "x"})
    )
    with pytest.raises(
        ContinuedRunMismatchError,
        match=rf"{root} holds a continued run of another task_text_sha256 "
        r"and weights_sha256 .*move that folder away",
    ):
        continue_pretraining(cfg, export, STEPS)
    assert sorted(p.name for p in root.iterdir()) == [SOURCE_FILE]  # refused before any stage or text


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(1500)  # 120-510 s on 2 shared cores
def test_a_killed_adapt_continue_resumes_its_continued_run_on_rerun(tmp_path):
    rows = _labelled_rows(per_label=10, chars=400)
    folder = _labelled_folder(tmp_path, rows)
    export, overrides = _export(tmp_path, PRESET, [r[1] for r in rows])
    out = tmp_path / "out"
    task = "finetune.tasks=[{name: t, train: " + json.dumps(str(folder)) + "}]"
    cmd = [
        sys.executable,
        "-m",
        "adapt",
        "continue",
        "--config",
        f"configs/{PRESET}.yaml",
        "--model",
        str(export),
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        *overrides,
        *QUICK,
        task,
    ]
    continued = tmp_path / f"run-{PRESET}" / "continued"
    ckpts = continued / "checkpoints"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        stages: dict[int, psutil.Process] = {}
        deadline = time.time() + 900
        while proc.poll() is None and not complete_tags(ckpts) and time.time() < deadline:
            stages.update({c.pid: c for c in psutil.Process(proc.pid).children(recursive=True)})
            time.sleep(0.05)
        assert proc.poll() is None, (
            f"adapt continue ended before its kill: {(tmp_path / 'killed.log').read_text()}"
        )
        stages.update({c.pid: c for c in psutil.Process(proc.pid).children(recursive=True)})
        proc.send_signal(signal.SIGKILL)  # the command only: no handler of it runs
        assert proc.wait(timeout=60) == -signal.SIGKILL
    _, alive = psutil.wait_procs(list(stages.values()), timeout=120)
    assert not alive, f"stages outlived the killed command: {alive}"  # no trainer left holding the run
    killed_at = complete_tags(ckpts)
    # the trainer stopped with the command (its SIGTERM checkpoint at most), not trained on alone to the end
    assert killed_at and max(killed_at) < tag_for(STEPS), killed_at
    assert (export / RESULT_FILE).is_file()  # the baseline was measured before the kill

    rerun = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    text = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, text[-4000:]
    assert "resumed from" in text, text[
        -4000:
    ]  # the continued run went on from its checkpoint, not from zero
    state = json.loads((continued / "export" / "training_state.json").read_text())
    assert state["step"] == STEPS and state["init_from"]["path"] == str(export)
    report = json.loads((out / RESULT_FILE).read_text())
    assert report["baseline"] == {"source": str(export / RESULT_FILE)}  # measured once, reused: same protocol
    assert report["tasks"]["t"]["continued"]["export"] == str(continued / "export")
    assert json.loads((continued / SOURCE_FILE).read_text())["export"] == str(export)
    staging = [
        str(p) for p in continued.rglob("*") if p.name.endswith((".tmp", ".staging")) or ".tmp-" in p.name
    ]
    assert not staging, staging
