"""Issue 64 item 2: a run folder is data, never code. A `__reduce__` payload planted in any checkpoint file that
lmstack or DeepSpeed unpickles (on export, on resume, on the universal conversion at another world size), with
COMPLETE's entry recomputed so that verification passes, is refused in one line naming the file and the global;
the payload never runs."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from core.exit_codes import CANNOT_CONTINUE
from tests.pretrain.conftest import run_module, torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed]

STEPS = ["checkpoint.every_steps=4", "checkpoint.keep_last=3", "eval.every_steps=1000"]


class Payload:
    """What an attacker plants: unpickling it runs `touch <marker>`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(folder: Path, name: str, marker: Path) -> None:
    """`name` in checkpoint `folder` gets the payload beside its real content, and COMPLETE the file's new entry
    (as an attacker with write access to the folder would do: COMPLETE's hashes are integrity, not
    authenticity)."""
    from pretrain.checkpoint.writer import file_entry

    path = folder / name
    real = torch.load(path, map_location="cpu", weights_only=False)  # our own file, written by the test's run
    torch.save({**real, "_planted": Payload(marker)}, path)
    complete = json.loads((folder / "COMPLETE").read_text())
    complete["files"][name] = file_entry(path)
    (folder / "COMPLETE").write_text(json.dumps(complete))


def _refused(res, path: Path, marker: Path, torchrun: bool = False) -> None:
    """Refused in one line naming the file and the global, the payload never run, no rank's traceback (under
    torchrun, its own summary of the ranks' exit codes follows: each rank exited CANNOT_CONTINUE)."""
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-4000:]
    assert not marker.exists(), f"the payload in {path.name} ran"
    line = next((x for x in out.splitlines() if "refused:" in x), None)
    assert line is not None, out[-4000:]
    assert str(path) in line and "posix.system" in line, line
    if torchrun:
        assert not re.search(r"\[rank\d\]:.*Traceback", out) and f"exitcode  : {CANNOT_CONTINUE}" in out, out
    else:
        assert res.returncode == CANNOT_CONTINUE and "Traceback" not in out, out[-4000:]


# 1 train to step 4, 4 exports, 3 refused 2-rank resumes, 1 refused and 1 finished 1-rank resume: measured
# 772 s with one more 2-rank resume on 2 cores under a load of 7
@pytest.mark.timeout(1500)
def test_a_payload_planted_in_any_checkpoint_file_is_refused_and_never_runs(roberta_run, tmp_path):
    out = isolated(roberta_run, tmp_path)
    run = Path(out.split("=", 1)[1])
    base = ["--config", str(roberta_run), out, *STEPS]
    torchrun(roberta_run, [out, *STEPS, "schedule.total_steps=4"], nproc=2)
    ckpts = run / "checkpoints"
    clean = tmp_path / "clean-step4"
    shutil.copytree(ckpts / "step00000004", clean)

    def fresh() -> Path:
        folder = ckpts / "step00000004"
        shutil.rmtree(folder)
        shutil.copytree(clean, folder)
        for extra in ckpts.glob("step00000004_*"):  # a universal conversion of an earlier try
            shutil.rmtree(extra)
        return folder

    optim = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    # export: the weights (model states, the ZeRO shards through zero_to_fp32), the client state, the probe
    for name in ("parity_probe.pt", "mp_rank_00_model_states.pt", optim):
        folder, marker = fresh(), tmp_path / f"PWNED-export-{name}"
        plant(folder, name, marker)
        res = run_module(["-m", "pretrain", "export", *base], check=False)
        _refused(res, folder / name, marker)
        assert not (run / "export").exists()
    # resume on 2 ranks: DeepSpeed's load (model states, each rank's optimizer shard) and our RNG state
    # (rank 0's optimizer shard goes through the same DeepSpeed load as rank 1's, and is covered on export)
    for name in (
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "rng_rank00001.pt",
    ):
        folder, marker = fresh(), tmp_path / f"PWNED-resume-{name}"
        plant(folder, name, marker)
        res = torchrun(roberta_run, [out, *STEPS, "schedule.total_steps=8"], nproc=2, check=False)
        _refused(res, folder / name, marker, torchrun=True)
        assert not (ckpts / "step00000008").exists()
    # resume on 1 rank: DeepSpeed's universal conversion unpickles every shard before anything is loaded
    folder, marker = fresh(), tmp_path / "PWNED-universal"
    plant(folder, "zero_pp_rank_1_mp_rank_00_optim_states.pt", marker)
    res = run_module(["-m", "pretrain", "train", *base, "schedule.total_steps=8"], check=False)
    _refused(res, folder / "zero_pp_rank_1_mp_rank_00_optim_states.pt", marker)
    assert not (ckpts / "step00000004_universal" / "COMPLETE").exists()

    # the same checkpoint, unplanted, still exports and resumes (at another world size too)
    fresh()
    run_module(["-m", "pretrain", "export", *base])
    assert json.loads((run / "export" / "COMPLETE").read_text())["step"] == 4
    torchrun(roberta_run, [out, *STEPS, "schedule.total_steps=8"], nproc=1)
    assert (ckpts / "step00000008" / "COMPLETE").is_file()
