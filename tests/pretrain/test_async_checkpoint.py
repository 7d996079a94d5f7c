"""Checkpoints off the critical path (issue 44, item 5), with the real engine on 2 gloo ranks: the step goes on
while a save is hashed and marked complete in the background, a kill in that window leaves the previous complete
checkpoint as `latest` and the resume is bit-exact, a background failure on one rank stops every rank naming the
checkpoint, and the next save waits for the previous one. The slow-disk test plug-in (tests/plugins/slow_disk.py,
installed into the run from outside: the product does not know it) stretches the background phases (a big
checkpoint's writing and hashing, a slow upload) so that a kill lands inside them."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from pretrain.checkpoint import CANNOT_CONTINUE_EXIT_CODE, COMPLETE, complete_tags
from tests.moto_s3 import s3_server, s3fs_client  # noqa: F401  (fixture)
from tests.plugins import slow_disk
from tests.pretrain.conftest import ROOT, child_env, torchrun, train_command, world_of_one
from tests.pretrain.test_exact_resume import OVERRIDES, _final_weights, _kill_tree, _trace_differences
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed]


def _start(config: Path, overrides: list[str], log, slow: str = "") -> subprocess.Popen:
    """The run, its background phases slowed by `slow` (the slow-disk plug-in's spec, e.g. "hash=4")."""
    cmd = train_command(config, overrides)
    env = slow_disk.env(slow, child_env()) if slow else child_env()
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _finishing(ckpt_dir: Path) -> list[str]:
    """Checkpoint folders whose files are written but that are not complete yet (the background part runs)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(
        d.name
        for d in ckpt_dir.iterdir()
        if d.name.startswith("step") and (d / "rng_rank00001.pt").is_file() and not (d / COMPLETE).exists()
    )


def _logged_steps(run: Path) -> list[int]:
    path = run / "logs" / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip().endswith("}")]
    return [r["step"] for r in rows if r["split"] == "train"]


def _wait_for(what, p: subprocess.Popen, timeout: float = 300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        got = what()
        if got:
            return got
        assert p.poll() is None, "the run ended before the awaited moment"
        time.sleep(0.01)
    raise AssertionError("timed out waiting")


def _unfinished(ckpt_dir: Path) -> list[str]:
    """Checkpoint folders that exist but are not complete (with async saves, the files are written later)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(
        d.name for d in ckpt_dir.iterdir() if d.name.startswith("step") and not (d / COMPLETE).exists()
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("phase", ["hash", "write"])
def test_kill_during_background_hashing_keeps_latest_and_resumes_exactly(gpt2_run, tmp_path, phase):
    """`hash`: killed while the written files are hashed; `write`: while the host snapshots of DeepSpeed's state,
    the RNG files and the probe are still being written (the step went on with the snapshot in memory)."""
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    ref_dir.mkdir()
    kill_dir.mkdir()
    torchrun(
        gpt2_run, [isolated(gpt2_run, ref_dir), *OVERRIDES, "checkpoint.async_mode=disabled"], timeout=600
    )

    out = isolated(gpt2_run, kill_dir)
    run = Path(out.split("=", 1)[1])
    ckpts = run / "checkpoints"
    log = open(tmp_path / "killed.log", "w")
    over = [out, *OVERRIDES]
    # Every save's background phase takes 4 s longer (slow storage): the step after a save goes on meanwhile.
    p = _start(gpt2_run, over, log, slow=f"{phase}=4")
    try:
        _wait_for(lambda: complete_tags(ckpts), p)
        # the next save's background part is writing or hashing: training has gone past it
        pending = _wait_for(lambda: (_finishing if phase == "hash" else _unfinished)(ckpts), p)[-1]
        step = int(pending[4:])
        _wait_for(lambda: max(_logged_steps(run), default=0) > step, p)
        latest_before = (ckpts / "latest").read_text()
        assert not (ckpts / pending / COMPLETE).exists()
        if phase == "write":  # nothing of it on disk yet: the step went on with the snapshot in memory
            assert not (ckpts / pending / "rng_rank00000.pt").exists()
    finally:
        _kill_tree(p)
    assert latest_before < pending
    assert (ckpts / "latest").read_text() == latest_before  # the kill left the previous complete checkpoint
    assert pending not in complete_tags(ckpts)

    p = _start(gpt2_run, over, log, slow="hash=0.5")
    assert p.wait(timeout=600) == 0, (tmp_path / "killed.log").read_text()[-4000:]
    log.close()
    text = (tmp_path / "killed.log").read_text()
    assert f"/{latest_before} at step {int(latest_before[4:])}" in text, text[-3000:]

    ref, got = _final_weights(ref_dir / "run"), _final_weights(run)
    different = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert ref.keys() == got.keys() and not different, (
        f"{len(different)} tensors differ, e.g. {different[:3]}"
    )
    assert not _trace_differences(ref_dir / "run", run)
    # The next save waited for the previous one: each kept checkpoint was complete before the next one's files.
    tags = complete_tags(ckpts)
    assert tags == ["step00000021", "step00000024"] and (ckpts / "latest").read_text() == "step00000024"
    first_file = min(f.stat().st_mtime for f in (ckpts / tags[1]).iterdir() if f.name != COMPLETE)
    assert (ckpts / tags[0] / COMPLETE).stat().st_mtime <= first_file
    assert not list(ckpts.glob("*/hashes.rank*"))  # the done markers are gone once COMPLETE is written


@pytest.mark.timeout(600)
def test_a_background_failure_on_one_rank_stops_every_rank_naming_the_checkpoint(gpt2_run, tmp_path):
    out = isolated(gpt2_run, tmp_path)
    run = Path(out.split("=", 1)[1])
    ckpts = run / "checkpoints"
    log = open(tmp_path / "run.log", "w")
    p = _start(
        gpt2_run, [out, *OVERRIDES, "schedule.total_steps=8", "checkpoint.every_steps=4"], log, slow="hash=3"
    )
    try:
        _wait_for(lambda: complete_tags(ckpts) == ["step00000004"], p)
        _wait_for(lambda: "step00000008" in _finishing(ckpts), p)
        # rank 1's done marker cannot be written: a folder stands where it goes (root ignores permissions)
        (ckpts / "step00000008" / "hashes.rank00001.json").mkdir()
        code = p.wait(timeout=300)
    finally:
        if p.poll() is None:
            _kill_tree(p)
    log.close()
    text = (tmp_path / "run.log").read_text()
    assert code != 0, text[-3000:]
    assert "finishing checkpoint step00000008 in the background failed (rank 1: " in text, text[-3000:]
    assert "last good checkpoint: step00000004" in text
    assert f"exitcode  : {CANNOT_CONTINUE_EXIT_CODE}" in text, text[-3000:]  # torchrun's summary of the ranks
    assert (ckpts / "latest").read_text() == "step00000004"
    assert not (ckpts / "step00000008").exists()  # never complete: removed


@pytest.mark.timeout(900)
def test_kill_during_upload_keeps_the_previous_checkpoint_in_the_bucket(s3_server, gpt2_run, tmp_path):  # noqa: F811
    from core.storage import RunStore

    fs = s3fs_client(s3_server)
    fs.mkdir("runs")
    url = "s3://runs/slow"
    local = gpt2_run.parent / "run"
    RunStore(local.resolve(), url).push([(local / "tokenizer").resolve(), (local / "tokens").resolve()])
    stage = tmp_path / "stage"
    over = [f"run.output_dir={url}", f"run.local_dir={stage}", *OVERRIDES, "schedule.total_steps=8",
            "checkpoint.every_steps=4"]  # fmt: skip
    log = open(tmp_path / "run.log", "w")
    p = _start(gpt2_run, over, log, slow="upload=6")

    def uploading_second() -> bool:
        fs.invalidate_cache()
        ckpts = next(stage.rglob("checkpoints"), None)
        return (
            ckpts is not None
            and (ckpts / "latest").is_file()
            and (ckpts / "latest").read_text() == "step00000008"
            and fs.exists(f"{url}/checkpoints/latest")
            and fs.cat(f"{url}/checkpoints/latest").decode() == "step00000004"
        )

    try:
        _wait_for(uploading_second, p, timeout=400)
    finally:
        _kill_tree(p)
    fs.invalidate_cache()
    assert fs.cat(f"{url}/checkpoints/latest").decode() == "step00000004"
    assert not fs.exists(f"{url}/checkpoints/step00000008/{COMPLETE}")

    shutil.rmtree(stage)  # another node: only the bucket is left
    p = _start(gpt2_run, over, log)
    assert p.wait(timeout=400) == 0, (tmp_path / "run.log").read_text()[-4000:]
    log.close()
    text = (tmp_path / "run.log").read_text()
    assert "step00000004 at step 4" in text, text[-3000:]
    fs.invalidate_cache()
    assert fs.cat(f"{url}/checkpoints/latest").decode() == "step00000008"
    assert fs.exists(f"{url}/checkpoints/step00000008/{COMPLETE}")


# A world of one (WORLD_OF_ONE_ENGINE): how many collectives a save puts on the step (issue 44: the saving step
# waited on nine of them: our opening barrier, DeepSpeed's two barriers and its two tag-validation all-reduces, three
# agreement all-reduces and a closing barrier). Every rank derives the tag from the step StepSync agrees on, so
# DeepSpeed's tag check (two all-reduces and a device read each) proves nothing; DeepSpeed's opening barrier already
# keeps the other ranks from writing before rank 0 has removed a partial folder; the last write-error check and the
# finiteness check are one all-reduce, and nothing after it needs a barrier.
SAVE_DRIVER = r"""
import collections, tempfile, time
from pathlib import Path
from pretrain.checkpoint.meta import COMPLETE, complete_tags
from pretrain.checkpoint.save import save_checkpoint
from pretrain.checkpoint.verify import verify_checkpoint

counts = collections.Counter()
for name in ("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_object", "broadcast_object_list",
             "reduce", "gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
    orig = getattr(torch.distributed, name)
    def counted(*a, _orig=orig, _name=name, **k):
        counts[_name] += 1
        return _orig(*a, **k)
    setattr(torch.distributed, name, counted)
ckpt_dir = Path(tempfile.mkdtemp()) / "checkpoints"
out = {}
pending = None
for step in (1, 2):
    counts.clear()
    if pending is not None:  # as CheckpointManager.save does: the previous save finishes first
        pending.wait()
    pending = save_checkpoint(engine, ckpt_dir, step, {"step": step}, keep_last=2)
    out[f"save{step}"] = dict(counts)
    # the background part finishes (a save interval is longer than that): COMPLETE alone is not enough, rank 0 then
    # writes `latest` and prunes, and a save meeting a rank 0 still busy asks once more (CI at 4898a06: 6 collectives)
    for _ in range(300):
        if (pending.folder / COMPLETE).is_file() and not pending.thread.is_alive():
            break
        time.sleep(0.1)
pending.wait()
out["complete"] = complete_tags(ckpt_dir)
out["verified"] = verify_checkpoint(ckpt_dir / out["complete"][-1])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_a_save_puts_at_most_four_collectives_on_the_step():
    got = world_of_one(SAVE_DRIVER)
    assert got["complete"] == ["step00000001", "step00000002"] and got["verified"] == [], got
    # the first save: DeepSpeed's opening and closing barriers, the write-error check before the probe, and the
    # last write-error check with the finiteness check; the second also waits for the first (one all-reduce: its background part is done)
    assert sum(got["save1"].values()) <= 4, got
    assert sum(got["save2"].values()) <= 5, got


# The step of an async save writes no file: every file (DeepSpeed's snapshots, its recovery scripts, the RNG state)
# is written by the background part. DeepSpeed copied zero_to_fp32.py and zero_to_torch.py into the checkpoints
# folder on the step, at every save (about 10 ms of the saving step's stall on the 2-core machine, issue 44).
NO_WRITE_DRIVER = r"""
import tempfile
from pathlib import Path
from pretrain.checkpoint.save import save_checkpoint
from pretrain.checkpoint.verify import verify_checkpoint
from tests.plugins import slow_disk

slow_disk.install("write=2")  # slow storage: the background part's writes wait, so the step's own writes show
ckpt_dir = Path(tempfile.mkdtemp()) / "checkpoints"
pending = save_checkpoint(engine, ckpt_dir, 1, {"step": 1}, keep_last=2)
on_step = sorted(str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file())
pending.wait()
after = sorted(str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file())
print("RESULT " + json.dumps({"on_step": on_step, "after": after, "verified": verify_checkpoint(pending.folder)}))
"""


@pytest.mark.timeout(300)
def test_the_step_of_an_async_save_writes_no_file():
    got = world_of_one(NO_WRITE_DRIVER)
    assert got["on_step"] == [], got
    # DeepSpeed's recovery scripts are still there for its users, written in the background
    assert {"zero_to_fp32.py", "zero_to_torch.py", "latest"} <= set(got["after"]), got
    assert got["verified"] == [], got
