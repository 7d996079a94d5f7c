"""Checkpoint verification, config changes on resume and the run-folder lock, without the engine (fast)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.errors import CannotContinueError
from pretrain.checkpoint import resume_diff
from pretrain.checkpoint.meta import (
    CANNOT_CONTINUE_EXIT_CODE,
    COMPLETE,
    PREEMPTED_EXIT_CODE,
    read_complete,
    tag_for,
)
from pretrain.checkpoint.nonfinite import nonfinite_flags
from pretrain.checkpoint.resume import select_resume_tag
from pretrain.checkpoint.verify import checkpoint_files, verify_files, write_complete
from pretrain.checkpoint.writer import file_entries
from pretrain.run.run_lock import LOCK_NAME, RunFolderLocked, RunLock
from pretrain.run.schedule import WarmupDecay


def _fake_checkpoint(root: Path, step: int, world: int = 2) -> Path:
    folder = root / tag_for(step)
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(os.urandom(4096))
    for r in range(world):
        (folder / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(os.urandom(2048))
        (folder / f"rng_rank{r:05d}.pt").write_bytes(os.urandom(512))
    files = file_entries(folder, checkpoint_files(folder))
    write_complete(folder, {"step": step, "world_size": world, "zero_stage": 2}, files)
    (root / "latest").write_text(folder.name)
    return folder


def test_complete_lists_every_file_with_size_and_checksum(tmp_path):
    folder = _fake_checkpoint(tmp_path, 4)
    meta = read_complete(tmp_path, folder.name)
    assert sorted(meta["files"]) == sorted(p.name for p in folder.iterdir() if p.name != COMPLETE)
    assert all(set(v) == {"size", "xxh3"} for v in meta["files"].values())
    assert verify_files(folder) == []


@pytest.mark.parametrize("damage", ["truncate", "zero", "delete_optim", "delete_rng"])
def test_damaged_newest_checkpoint_falls_back_to_previous(tmp_path, damage):
    _fake_checkpoint(tmp_path, 4)
    new = _fake_checkpoint(tmp_path, 8)
    target = {
        "truncate": "mp_rank_00_model_states.pt",
        "zero": "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "delete_optim": "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "delete_rng": "rng_rank00001.pt",
    }[damage]
    path = new / target
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "zero":
        path.write_bytes(bytes(path.stat().st_size))
    else:
        path.unlink()
    warnings: list[str] = []
    assert select_resume_tag(tmp_path, warn=warnings.append) == "step00000004"
    assert len(warnings) == 1 and "step00000008" in warnings[0] and target in warnings[0], warnings
    assert {"truncate": "100 bytes", "zero": "checksum", "delete_optim": "missing", "delete_rng": "missing"}[
        damage
    ] in warnings[0]
    # verification split over 2 ranks finds the same problem on exactly one of them
    shares = [verify_files(new, r, 2) for r in range(2)]
    assert sum(len(s) for s in shares) == 1


def test_every_checkpoint_damaged_stops_with_clear_message(tmp_path):
    for step in (4, 8):
        (_fake_checkpoint(tmp_path, step) / "rng_rank00000.pt").unlink()
    with pytest.raises(CannotContinueError, match="no usable checkpoint left") as e:
        select_resume_tag(tmp_path, warn=lambda _m: None)
    assert "step00000004" in str(e.value) and "step00000008" in str(e.value)
    assert CANNOT_CONTINUE_EXIT_CODE != PREEMPTED_EXIT_CODE
    assert select_resume_tag(tmp_path / "none") is None  # a fresh run


# --- config changes on resume --------------------------------------------------------------------------------
OLD = {
    "optim": {"lr": 1e-3, "betas": [0.9, 0.98]},
    "schedule": {"total_steps": 30, "warmup_steps": 2},
    "batch": {"global_batch_size": 8},
    "model": {"hidden_size": 64},
    "data": {"sources": [{"name": "a", "paths": ["x"]}]},
    "checkpoint": {"every_steps": 4},
}


def _new(**changes) -> dict:
    new = json.loads(json.dumps(OLD))
    for key, value in changes.items():
        node = new
        *head, last = key.split("__")
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[last] = value
    return new


def test_safe_changes_are_applied_and_listed():
    ch = resume_diff.compare(
        OLD, _new(schedule__total_steps=33, optim__lr=5e-4, checkpoint__every_steps=1), step=30, accept=False
    )
    assert [k for k, *_ in ch.applied] == ["checkpoint.every_steps", "optim.lr", "schedule.total_steps"]
    text = ch.describe()
    assert "schedule.total_steps: 30 -> 33 (the LR schedule is re-derived from the current step)" in text
    assert "optim.lr: 0.001 -> 0.0005 (the new peak LR takes effect now)" in text
    # a key the code adds later (e.g. a schedule budget) is not a change against an older checkpoint
    assert resume_diff.compare(OLD, _new(schedule__budget_minutes=5), 30, False).applied == []
    assert resume_diff.policy("schedule.budget_minutes") == "apply"


def test_unsafe_changes_are_refused_with_old_new_and_flag():
    with pytest.raises(CannotContinueError) as e:
        resume_diff.compare(
            OLD,
            _new(batch__global_batch_size=16, model__hidden_size=128, data__sources__0__paths=["y"]),
            step=30,
            accept=False,
        )
    msg = str(e.value)
    for line in (
        "batch.global_batch_size: checkpoint 8, now 16",
        "model.hidden_size: checkpoint 64, now 128",
        "data.sources.0.paths: checkpoint ['x'], now ['y']",
        resume_diff.ACCEPT_FLAG,
    ):
        assert line in msg, msg
    ch = resume_diff.compare(OLD, _new(batch__global_batch_size=16), step=30, accept=True)
    assert ch.refused == [("batch.global_batch_size", 8, 16)] and "accepted with" in ch.describe()
    with pytest.raises(
        CannotContinueError, match="schedule.total_steps .20. is below the checkpoint's step 30"
    ):
        resume_diff.compare(OLD, _new(schedule__total_steps=20), step=30, accept=False)


def test_reapplied_schedule_takes_new_peak_and_length_at_restored_step():
    import torch

    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [p], "weight_decay": 0.1}], lr=1e-3, betas=(0.9, 0.98))
    old = torch.optim.lr_scheduler.LambdaLR(opt, WarmupDecay(2, 30, "linear", 0.0))
    for _ in range(30):
        opt.step()
        old.step()
    state, opt_state = old.state_dict(), opt.state_dict()
    assert old.get_last_lr()[0] == 0.0  # the end of the 30-step schedule

    opt2 = torch.optim.AdamW([{"params": [p], "weight_decay": 0.0}], lr=5e-4, betas=(0.8, 0.9))
    new = torch.optim.lr_scheduler.LambdaLR(opt2, WarmupDecay(2, 33, "linear", 0.0))
    snap = resume_diff.schedule_snapshot(new)
    opt2.load_state_dict(opt_state)
    new.load_state_dict(state)
    assert new.get_last_lr()[0] == 0.0 and opt2.param_groups[0]["betas"] == (0.9, 0.98)  # the silent bug
    resume_diff.reapply_schedule(new, snap)
    assert new.get_last_lr()[0] == pytest.approx(5e-4 * WarmupDecay(2, 33, "linear", 0.0)(30))
    assert new.get_last_lr()[0] > 0 and opt2.param_groups[0]["betas"] == (0.8, 0.9)
    assert opt2.param_groups[0]["weight_decay"] == 0.0
    opt2.step()
    new.step()
    assert new.get_last_lr()[0] == pytest.approx(5e-4 * WarmupDecay(2, 33, "linear", 0.0)(31))


# --- the run-folder lock ---------------------------------------------------------------------------------------
def test_second_run_on_a_folder_is_refused_naming_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        info = {"host": socket.gethostname(), "pid": holder.pid, "started": "then", "proc_start": None}
        (tmp_path / LOCK_NAME).write_text(json.dumps(info))
        with pytest.raises(
            RunFolderLocked,
            match=f"in use by another training run: host {socket.gethostname()} pid {holder.pid}",
        ):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead now: its lock is stale and taken over
    lock = RunLock(tmp_path)
    assert "took over a stale lock" in lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    with pytest.raises(RunFolderLocked):  # held by this live process
        RunLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_lock_from_another_host_is_reported(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "gpu-node-17", "pid": 4242, "started": "Monday"}))
    with pytest.raises(RunFolderLocked, match="host gpu-node-17 pid 4242 since Monday on another host"):
        RunLock(tmp_path).acquire()


def test_plan_shows_the_resume_point_and_config_changes(tmp_path):
    from pretrain.tools.plan import format_report, plan_report
    from runconfig import load_config
    from runconfig.load import to_dict

    old = load_config("configs/roberta-tiny.yaml", [f"run.output_dir={tmp_path}", "schedule.total_steps=30"])
    folder = _fake_checkpoint(tmp_path / "checkpoints", 30)
    meta = read_complete(folder.parent, folder.name)
    write_complete(folder, {**meta, "config": to_dict(old)}, meta["files"])
    new = load_config(
        "configs/roberta-tiny.yaml",
        [
            f"run.output_dir={tmp_path}",
            "schedule.total_steps=33",
            "optim.lr=5e-4",
            "batch.global_batch_size=64",
        ],
    )
    text = format_report(plan_report(new, 2))
    assert f"resume            from {folder} at step 30" in text
    assert (
        "applied: schedule.total_steps: 30 -> 33 (the LR schedule is re-derived from the current step)"
        in text
    )
    assert "applied: optim.lr: 0.001 -> 0.0005" in text
    assert (
        "refused (the run stops unless checkpoint.accept_config_changes=true): batch.global_batch_size: 32 -> 64"
        in text
    )


def test_a_host_snapshot_is_detached_compact_and_keeps_what_cannot_be_copied():
    """What an async save writes in the background: the state at the save, whatever the step does next."""
    import threading
    from collections import OrderedDict

    from pretrain.checkpoint.staging import HostStaging

    flat = torch.arange(1000, dtype=torch.float32)
    lock = threading.Lock()  # stands in for what deepcopy cannot copy (a process group, DeepSpeed's config)
    state = {
        "module": OrderedDict(w=flat[:10]),
        "groups": [{"lr": 0.1, "params": [0, 1]}],
        "cfg": lock,
        "shapes": (torch.Size([10]),),
    }
    snap = HostStaging().snapshot(state, "mp_rank_00_model_states.pt")
    flat.add_(1.0)  # the next optimizer step
    state["groups"][0]["lr"] = 0.2
    assert torch.equal(snap["module"]["w"], torch.arange(10, dtype=torch.float32))
    assert snap["module"]["w"].untyped_storage().nbytes() == 10 * 4  # a view's copy holds only its own values
    assert type(snap["module"]) is OrderedDict and snap["groups"][0]["lr"] == 0.1
    assert snap["cfg"] is lock and snap["shapes"] == (torch.Size([10]),)
    # DeepSpeed's param_shapes: zero_to_fp32 calls .numel() on them
    assert type(snap["shapes"][0]) is torch.Size


def test_host_staging_refills_the_same_buffers_from_one_save_to_the_next():
    """A save's snapshot is copied into the buffers the previous save used (the next save waits for the previous
    one's background part): no allocation and no fresh pages per save. A tensor whose shape or dtype changed gets a
    new buffer; a file with fewer tensors keeps no stale ones. The snapshot is the state at the save."""
    from collections import OrderedDict

    from pretrain.checkpoint.staging import HostStaging

    flat = torch.arange(1000, dtype=torch.float32)
    state = {"module": OrderedDict(w=flat[:10], b=torch.ones(3)), "step": 4, "shapes": (torch.Size([10]),)}
    staging = HostStaging()
    first = staging.snapshot(state, "mp_rank_00_model_states.pt")
    flat.add_(1.0)  # the next optimizer step: the snapshot keeps the state at the save
    assert torch.equal(first["module"]["w"], torch.arange(10, dtype=torch.float32))
    assert first["module"]["w"].untyped_storage().nbytes() == 40  # a view's copy holds only its own values
    assert type(first["module"]) is OrderedDict and first["step"] == 4
    assert type(first["shapes"][0]) is torch.Size
    w_ptr, b_ptr = first["module"]["w"].data_ptr(), first["module"]["b"].data_ptr()

    twice = staging.snapshot(state, "mp_rank_00_model_states.pt")  # the same name again in one save
    assert twice["module"]["w"].data_ptr() != w_ptr
    # the first left as it was
    assert torch.equal(first["module"]["w"], torch.arange(10, dtype=torch.float32))
    staging.synchronize()  # the save's snapshots are taken (SnapshotWrites.take)

    second = staging.snapshot(state, "mp_rank_00_model_states.pt")  # the next save of the same file
    assert second["module"]["w"].data_ptr() == w_ptr and second["module"]["b"].data_ptr() == b_ptr
    assert torch.equal(second["module"]["w"], torch.arange(1, 11, dtype=torch.float32))
    other = staging.snapshot({"m": torch.ones(3)}, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert other["m"].data_ptr() not in (w_ptr, b_ptr)  # each file its own buffers
    staging.synchronize()

    # a changed tensor: a new buffer, the others kept
    state["module"]["b"] = torch.zeros(4, dtype=torch.float64)
    third = staging.snapshot(state, "mp_rank_00_model_states.pt")
    staging.synchronize()
    assert third["module"]["w"].data_ptr() == w_ptr and third["module"]["b"].data_ptr() != b_ptr
    assert third["module"]["b"].dtype == torch.float64
    assert torch.equal(third["module"]["b"], torch.zeros(4, dtype=torch.float64))
    fourth = staging.snapshot({"module": OrderedDict(w=flat[:10])}, "mp_rank_00_model_states.pt")
    assert fourth["module"]["w"].data_ptr() == w_ptr
    staging.synchronize()
    # held: the model states' [w] (b's float64 buffer let go), the same-save copy's [w, b], the optimizer file's [m]
    assert staging.held_bytes() == 40 + (40 + 12) + 12


def test_nonfinite_flags_name_exactly_the_tensors_holding_nan_or_inf():
    """The finiteness gate of a save: NaN, +inf and -inf flag their tensor; large finite weights (1e30, whose squares
    overflow a 2-norm) and a tensor of zeros do not."""
    import types

    module = torch.nn.ParameterDict(
        {k: torch.nn.Parameter(torch.zeros(1000)) for k in ("ok", "nan", "pinf", "ninf", "big", "empty")}
    )
    module["empty"] = torch.nn.Parameter(torch.zeros(0))  # a ZeRO-3 rank's empty partition: not checked
    with torch.no_grad():
        module["nan"][3] = float("nan")
        module["pinf"][999] = float("inf")
        module["ninf"][0] = -float("inf")
        module["big"].fill_(1e30)
    names, flags = nonfinite_flags(types.SimpleNamespace(module=module, device=torch.device("cpu")))
    assert dict(zip(names, flags.tolist(), strict=True)) == {
        "ok": False, "nan": True, "pinf": True, "ninf": True, "big": False}  # fmt: skip
