"""Issue 64 item 4: a step folder that is a symbolic link (to another run's checkpoint, or anywhere) is a link the
user made, not a checkpoint this run wrote. Pruning it removed COMPLETE *through* the link, so the other run's
checkpoint could no longer be resumed or exported, then `rmtree(..., ignore_errors=True)` quietly refused the link
itself. Now pruning, the abandoned-folder sweep and a save at that step remove the link alone, say so, and never
touch what it points to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrain.checkpoint import COMPLETE
from pretrain.checkpoint.prune import prune_checkpoints, remove_abandoned
from pretrain.checkpoint.universal import UNIVERSAL_SUFFIX
from tests.pretrain.conftest import torchrun
from tests.pretrain.test_train_deepspeed import isolated


def _folder(root: Path, step: int, complete: bool = True) -> Path:
    d = root / f"step{step:08d}"
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    if complete:
        (d / COMPLETE).write_text(json.dumps({"step": step}))
    return d


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.timeout(60)
def test_pruning_a_linked_step_folder_removes_the_link_and_nothing_it_points_to(tmp_path, capsys):
    other = tmp_path / "runA" / "checkpoints"
    target = _folder(other, 600)
    (other / "latest").write_text("step00000600")
    before = _tree(tmp_path / "runA")
    ckpts = tmp_path / "runB" / "checkpoints"
    for step in (604, 608, 612):
        _folder(ckpts, step)
    (ckpts / "step00000002").symlink_to(target, target_is_directory=True)
    (ckpts / f"step00000002{UNIVERSAL_SUFFIX}").symlink_to(other, target_is_directory=True)
    prune_checkpoints(ckpts, keep_last=2)
    assert _tree(tmp_path / "runA") == before  # COMPLETE and every file of runA's checkpoint are still there
    assert sorted(p.name for p in ckpts.iterdir()) == ["step00000608", "step00000612"]
    assert f"{ckpts / 'step00000002'} is a link to {target}" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_the_abandoned_folder_sweep_never_follows_a_link(tmp_path):
    elsewhere = _folder(tmp_path / "elsewhere", 3, complete=False)  # looks abandoned, but is not this run's
    before = _tree(tmp_path / "elsewhere")
    ckpts = tmp_path / "run" / "checkpoints"
    _folder(ckpts, 8)
    (ckpts / "step00000003").symlink_to(elsewhere, target_is_directory=True)
    remove_abandoned(ckpts, 8)
    assert _tree(tmp_path / "elsewhere") == before
    assert sorted(p.name for p in ckpts.iterdir()) == ["step00000008"]


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_training_past_a_linked_old_checkpoint_leaves_the_other_run_resumable(roberta_run, tmp_path):
    """The issue's reproduction: run B holds a link to run A's checkpoint among its old ones and trains on with
    keep_last 2; run A's checkpoint keeps its COMPLETE and every file."""
    run_a = tmp_path / "a"
    run_a.mkdir()
    out_a = isolated(roberta_run, run_a)
    torchrun(roberta_run, [out_a, "schedule.total_steps=4", "checkpoint.every_steps=4"], timeout=600)
    a_ckpt = Path(out_a.split("=", 1)[1]) / "checkpoints" / "step00000004"
    before = _tree(a_ckpt)
    assert COMPLETE in before
    run_b = tmp_path / "b"
    run_b.mkdir()
    out_b = isolated(roberta_run, run_b)
    steps = ["checkpoint.every_steps=2", "checkpoint.keep_last=2"]
    torchrun(roberta_run, [out_b, *steps, "schedule.total_steps=4"], timeout=600)
    b_ckpts = Path(out_b.split("=", 1)[1]) / "checkpoints"
    (b_ckpts / "step00000001").symlink_to(a_ckpt, target_is_directory=True)
    res = torchrun(roberta_run, [out_b, *steps, "schedule.total_steps=8"], timeout=600)
    assert _tree(a_ckpt) == before
    assert sorted(p.name for p in b_ckpts.iterdir() if p.name.startswith("step")) == [
        "step00000006", "step00000008"
    ]  # fmt: skip
    assert f"{b_ckpts / 'step00000001'} is a link to {a_ckpt}" in res.stderr
