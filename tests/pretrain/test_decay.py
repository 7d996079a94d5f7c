"""`python -m pretrain decay`: a WSD cool-down from a stable-phase checkpoint equals an independent WSD run of
the same length, step for step; killed, it resumes from its own checkpoint exactly; bad input is refused in one
line naming the flag or key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigError
from pretrain.tools.decay import branch_overrides
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "gpt2-tiny.yaml"
WSD = [
    "schedule.decay=wsd",
    "schedule.total_steps=40",
    "schedule.warmup_steps=2",
    "schedule.decay_fraction=0.25",
]


def _with_checkpoints(tmp_path: Path, steps: list[int], extra: list[str] = WSD):
    cfg = load_config(TINY, [f"run.output_dir={tmp_path}/run", *extra])
    for s in steps:
        d = tmp_path / "run" / "checkpoints" / f"step{s:08d}"
        d.mkdir(parents=True)
        (d / "COMPLETE").write_text("{}")
    return cfg


@pytest.mark.timeout(60)
def test_the_branch_is_a_shorter_wsd_run_resumed_from_the_step(tmp_path):
    cfg = _with_checkpoints(tmp_path, [6, 12])
    overrides, record = branch_overrides(cfg, 6, 20)
    branch = load_config(TINY, [f"run.output_dir={tmp_path}/run", *WSD, *overrides])
    assert branch.schedule.steps == 26 and branch.schedule.wsd_decay_start == 6
    assert f"checkpoint.resume={tmp_path}/run/checkpoints/step00000006" in overrides
    assert record["from_step"] == 6 and record["total_steps"] == 26
    assert str(branch.checkpoint_dir).startswith(str(tmp_path / "run" / "decay" / "step6+20"))


@pytest.mark.timeout(60)
def test_a_branch_of_a_run_with_its_own_checkpoint_dir_starts_there_and_saves_in_its_folder(tmp_path):
    """The run's `checkpoint.dir` is where the branch starts from, not where it saves: like a ladder's rungs, the
    branch keeps its checkpoints in its own folder, and resumes only from its step or from there."""
    shared = tmp_path / "scratch" / "ckpts"
    user = [f"run.output_dir={tmp_path}/run", f"checkpoint.dir={shared}", *WSD]
    (shared / "step00000006").mkdir(parents=True)
    (shared / "step00000006" / "COMPLETE").write_text("{}")
    cfg = load_config(TINY, user)
    overrides, record = branch_overrides(cfg, 6, 20)
    branch = load_config(TINY, [*user, *overrides])
    folder = tmp_path / "run" / "decay" / "step6+20"
    assert record["from_checkpoint"] == str(shared / "step00000006")
    assert Path(branch.checkpoint_dir) == folder / "checkpoints"
    assert branch.checkpoint.resume == str(shared / "step00000006")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra,step,steps,match",
    [
        (["schedule.decay=cosine"], 6, 4, "needs schedule.decay: wsd"),
        (WSD, 30, 4, r"--from 30: the step is in the decay phase \(it starts at step 30\)"),
        (WSD, 1, 4, r"--from 1: the step is in the warmup"),
        (WSD, 9, 4, r"no complete checkpoint step00000009 .* \(stable-phase .*: step00000006\)"),
        (WSD, 6, 0, r"--steps 0: a cool-down needs at least one step"),
    ],
)
def test_bad_branches_are_refused_naming_the_flag(tmp_path, extra, step, steps, match):
    cfg = _with_checkpoints(tmp_path, [6], extra)
    with pytest.raises(ConfigError, match=match):
        branch_overrides(cfg, step, steps)


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "logs" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_a_killed_branch_resumes_and_equals_an_independent_wsd_run(tmp_path):
    from tests.pretrain.conftest import child_env, torchrun, train_command
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

    config, out = prepare_smoke_run(tmp_path)
    main = [*WSD, "checkpoint.every_steps=3", "checkpoint.keep_last=20"]
    torchrun(config, main, timeout=300)
    branch = out / "decay" / "step6+20"
    decay = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *train_command(config, main, 2)[3:7],
        "-m",
        "pretrain",
        "decay",
        "--config",
        str(config),
        "--from",
        "6",
        "--steps",
        "20",
        *main,
    ]
    with open(tmp_path / "branch.log", "wb") as log:
        proc = subprocess.Popen(
            decay, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        first = branch / "checkpoints" / "step00000009" / "COMPLETE"
        deadline = time.time() + 300
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert first.exists(), (tmp_path / "branch.log").read_text()[-3000:]
    assert not (branch / "checkpoints" / "step00000026").exists(), "the branch finished before the kill"
    res = subprocess.run(decay, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # it went on from its own checkpoint, not from the run's step 6
    assert f"[train] resumed from {branch / 'checkpoints'}/step000000" in res.stdout, res.stdout[-2000:]
    # the independent run: WSD over 26 steps whose cool-down starts at step 6
    alone = tmp_path / "alone"
    alone.mkdir()
    for stage in ("tokenizer", "tokens"):
        (alone / stage).symlink_to(out / stage)
    torchrun(
        config,
        [*main, f"run.output_dir={alone}", "schedule.total_steps=26", f"schedule.decay_fraction={20 / 26!r}"],
        timeout=300,
    )
    got, want = _losses(branch), _losses(alone)
    assert sorted(got) == list(range(7, 27)) or set(range(10, 27)) <= set(got), sorted(got)
    for step in range(10, 27):
        assert got[step] == pytest.approx(want[step], abs=1e-4), step
    record = json.loads((branch / "branch.json").read_text())
    assert record["from_step"] == 6 and record["steps"] == 20
