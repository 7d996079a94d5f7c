"""A checkpoint folder that can never complete is removed by the next save: the 20-kill soak
(tests/faults/test_soak.py) found step 13 of a run that saves every 2 steps left without COMPLETE in a finished run
(a SIGKILL while keep_last removed it after a SIGTERM save at that off-grid step)."""

from __future__ import annotations

from pathlib import Path

from pretrain.checkpoint import COMPLETE
from pretrain.checkpoint.prune import remove_abandoned


def _folder(ckpts: Path, step: int, complete: bool) -> Path:
    d = ckpts / f"step{step:08d}"
    d.mkdir(parents=True)
    (d / "rng_rank00000.pt").write_bytes(b"x")
    if complete:
        (d / COMPLETE).write_text("{}")
    return d


def test_incomplete_folders_before_the_saved_step_are_removed(tmp_path):
    ckpts = tmp_path / "checkpoints"
    _folder(ckpts, 13, complete=False)  # abandoned: training is past it
    _folder(ckpts, 14, complete=True)
    _folder(ckpts, 15, complete=True)
    _folder(ckpts, 16, complete=True)  # the step just saved
    _folder(ckpts, 17, complete=False)  # after the saved step: not this save's to judge
    (ckpts / "step00000012_universal").mkdir()  # not a step folder
    remove_abandoned(ckpts, 16)
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "step00000012_universal", "step00000014", "step00000015", "step00000016", "step00000017"
    ]  # fmt: skip
