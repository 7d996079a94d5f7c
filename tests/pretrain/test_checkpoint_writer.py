"""The writer process of async saves (`checkpoint.async_writer: process`, issue 44): the same files and hashes as
the background thread writes, from another process; its failures come back as errors naming it; it outlives
neither its trainer nor an exit that skips closing it, and a preemption's SIGTERM does not stop a save it is
writing."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest
import torch

from pretrain.checkpoint_writer import (
    PAUSE_ENV,
    TorchFile,
    WriterProcess,
    lowest_priority,
    pause,
    write_and_hash,
)
from tests.pretrain.conftest import ROOT, world_of_one


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"module": {"w": torch.randn(64, 32, generator=g), "b": torch.arange(7)}, "step": 3, "name": "x"}


def _files(folder: Path) -> list[TorchFile]:
    folder.mkdir(parents=True)
    return [
        TorchFile(folder / "model_states.pt", _state(), atomic=False),
        TorchFile(folder / "rng.pt", {"r": [1, 2]}),
    ]


def _gone(pid: int, timeout: float = 10) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(120)
def test_the_writer_process_writes_and_hashes_what_the_thread_would(tmp_path):
    names = ["model_states.pt", "rng.pt"]
    here = write_and_hash(_files(tmp_path / "thread" / "step1"), tmp_path / "thread" / "step1", names)
    w = WriterProcess()
    try:
        there = w.write_and_hash(
            _files(tmp_path / "process" / "step1"), tmp_path / "process" / "step1", names
        )
        assert w.pid is not None and w.pid != os.getpid()
        assert there == here  # the same bytes, so the same sizes and xxh3
        got = torch.load(tmp_path / "process" / "step1" / "model_states.pt", weights_only=False)
        assert torch.equal(got["module"]["w"], _state()["module"]["w"]) and got["step"] == 3
        # a failure in the writer comes back as that error, errno kept (a full disk is named by it), and the writer
        # serves the next save
        (tmp_path / "blocked" / "x.pt").mkdir(parents=True)
        with pytest.raises(IsADirectoryError) as err:
            w.write_and_hash(
                [TorchFile(tmp_path / "blocked" / "x.pt", {"a": 1})], tmp_path / "blocked", ["x.pt"]
            )
        assert err.value.errno == errno.EISDIR
        pid = w.pid
        assert w.write_and_hash(_files(tmp_path / "again"), tmp_path / "again", names) == here
        assert w.pid == pid
    finally:
        w.close()
    assert _gone(pid)


@pytest.mark.timeout(120)
def test_a_writer_killed_mid_save_is_named_not_waited_for(tmp_path, monkeypatch):
    monkeypatch.setenv(PAUSE_ENV, "hash=60")  # the writer inherits it: it waits before hashing
    w = WriterProcess()
    out: dict = {}

    def save() -> None:
        try:
            w.write_and_hash(_files(tmp_path / "step1"), tmp_path / "step1", ["rng.pt"])
        except RuntimeError as e:
            out["error"] = str(e)

    t = threading.Thread(target=save)
    t.start()
    t0 = time.time()
    while not (tmp_path / "step1" / "rng.pt").is_file() and time.time() - t0 < 60:  # written, now pausing
        time.sleep(0.05)
    os.kill(w.pid, signal.SIGKILL)
    t.join(timeout=20)
    assert not t.is_alive(), "the save waited on a dead writer"
    assert "the checkpoint writer process" in out["error"] and "exited with code -9" in out["error"], out
    assert str(tmp_path / "step1") in out["error"]
    w.close()


@pytest.mark.timeout(120)
def test_a_sigterm_does_not_stop_the_save_it_is_writing(tmp_path, monkeypatch):
    """A preemption signals every process of the job; the trainer saves and exits, its writer finishes that save."""
    monkeypatch.setenv(PAUSE_ENV, "hash=1.5")
    w = WriterProcess()
    done: dict = {}
    t = threading.Thread(
        target=lambda: done.update(w.write_and_hash(_files(tmp_path / "s"), tmp_path / "s", ["rng.pt"]))
    )
    t.start()
    t0 = time.time()
    while not (tmp_path / "s" / "rng.pt").is_file() and time.time() - t0 < 60:
        time.sleep(0.05)
    os.kill(w.pid, signal.SIGTERM)
    t.join(timeout=30)
    assert set(done) == {"rng.pt"}
    w.close()


# A trainer killed as a node crash would be (SIGKILL, nothing runs after it): its writer must not go on writing
# into a folder the next run will own.
ORPHAN_DRIVER = r"""
import os, sys, threading, time
from pathlib import Path
os.environ["LMSTACK_CKPT_PAUSE"] = "hash=120"
from tests.pretrain.test_checkpoint_writer import _files
from pretrain.checkpoint_writer import WriterProcess
w = WriterProcess()
folder = Path(sys.argv[1])
threading.Thread(target=w.write_and_hash, args=(_files(folder), folder, ["rng.pt"]), daemon=True).start()
while not (folder / "rng.pt").is_file():
    time.sleep(0.05)
print(w.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_the_writer_dies_with_its_trainer(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", ORPHAN_DRIVER, str(tmp_path / "step1")], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        writer = int(p.stdout.readline())
        assert psutil.pid_exists(writer)
    finally:
        p.kill()
        p.wait(timeout=30)
    assert _gone(writer), "the writer outlived its killed trainer"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("zipfile_format", [True, False])
def test_a_deepspeed_file_written_through_a_python_file_loads_as_torch_save_of_the_path(
    tmp_path, zipfile_format
):
    """DeepSpeed's state dicts go to a Python file, not the path (torch's own file writer holds the
    interpreter lock for every byte): the file must load as the path's would, and a zip archive's CRCs must check
    (DeepSpeed, zero_to_fp32 and `unzip -t` read them)."""
    state = _state()
    TorchFile(tmp_path / "ours.pt", state, atomic=False, zipfile=zipfile_format).write()
    torch.save(state, tmp_path / "path.pt", _use_new_zipfile_serialization=zipfile_format)
    ours, path = (torch.load(tmp_path / n, weights_only=False) for n in ("ours.pt", "path.pt"))
    assert torch.equal(ours["module"]["w"], path["module"]["w"]) and torch.equal(
        ours["module"]["b"], path["module"]["b"]
    )
    assert (ours["step"], ours["name"]) == (path["step"], path["name"])
    if zipfile_format:
        with zipfile.ZipFile(tmp_path / "ours.pt") as z:
            assert z.testzip() is None
    else:  # the legacy format is written the same way whatever the target
        assert (tmp_path / "ours.pt").read_bytes() == (tmp_path / "path.pt").read_bytes()


@pytest.mark.timeout(30)
def test_files_are_hashed_as_they_are_written_and_match_a_read_back(tmp_path, monkeypatch):
    """The background part hashes what it writes on the way (no second pass over the files); the entries are those
    of reading the files back, for every format and atomicity DeepSpeed's files, the RNG and the probe use. A file
    it did not write (another engine's, a recovery script) is still read back."""
    import pretrain.checkpoint_writer as W

    state = _state()
    files = [
        TorchFile(tmp_path / "zip.pt", state, atomic=False),
        TorchFile(tmp_path / "legacy.pt", state, atomic=False, zipfile=False),
        TorchFile(tmp_path / "atomic_zip.pt", state),
        TorchFile(tmp_path / "atomic_legacy.pt", state, zipfile=False),
    ]
    (tmp_path / "other.txt").write_text("written on the step")
    names = [f.path.name for f in files] + ["other.txt"]
    read_back: list[str] = []
    checksum = W.checksum
    monkeypatch.setattr(W, "checksum", lambda path: read_back.append(path.name) or checksum(path))
    got = write_and_hash(files, tmp_path, names)
    assert read_back == ["other.txt"]
    monkeypatch.setattr(W, "checksum", checksum)
    assert got == W.file_entries(tmp_path, names)


@pytest.mark.timeout(30)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a per-thread nice value is Linux's")
def test_the_background_part_runs_at_the_lowest_priority_and_the_loop_keeps_its_own():
    """The save's background thread (and the writer process) lower their own CPU priority only: on a host with no
    idle core the background takes the scheduler's leftovers, and the training thread's priority is untouched."""
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []

    def background() -> None:
        lowest_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=background)
    t.start()
    t.join()
    assert seen == [19]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before


@pytest.mark.timeout(10)
def test_bad_pause_spec_is_refused(monkeypatch):
    """The test-only pause names what it refuses (a typo would otherwise pause nothing)."""
    monkeypatch.setenv(PAUSE_ENV, "hashing=1")
    with pytest.raises(ValueError, match="'hashing' is not one of write, hash, upload"):
        pause("hash")


# With the real engine (a world of one): in process mode the trainer's process serializes nothing, DeepSpeed's state
# dicts and the RNG state included, and the checkpoints verify; the thread mode, run alike, serializes in the trainer
# (what the counter must see for the first figure to mean anything).
SERIALIZE_DRIVER = r"""
import tempfile, time
from pathlib import Path
from pretrain import checkpoint as ck

calls = []
orig_save = torch.save
def counted(obj, f, *a, **k):
    calls.append(str(f))
    return orig_save(obj, f, *a, **k)
torch.save = counted
out = {}
for writer in ("process", "thread"):
    calls.clear()
    ckpt_dir = Path(tempfile.mkdtemp()) / "checkpoints"
    for step in (1, 2):
        folder = ck.save_checkpoint(engine, ckpt_dir, step, {"step": step}, keep_last=2, writer=writer)
    ck.wait_for_save()
    out[writer] = {"saves_in_trainer": len(calls), "complete": ck.complete_tags(ckpt_dir),
                   "verified": ck.verify_checkpoint(folder), "writer_pid": ck._writer.pid if ck._writer else None}
ck.close_writer()
out["closed"] = ck._writer is None
print("RESULT " + json.dumps(out))
"""


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(300)
def test_in_process_mode_the_trainer_serializes_no_checkpoint_file():
    got = world_of_one(SERIALIZE_DRIVER)
    for writer in ("process", "thread"):
        assert got[writer]["complete"] == ["step00000001", "step00000002"], got
        assert got[writer]["verified"] == [], got
    assert got["process"]["saves_in_trainer"] == 0 and got["process"]["writer_pid"] is not None, got
    assert got["thread"]["saves_in_trainer"] >= 4, (
        got
    )  # per save: DeepSpeed's model and optimizer states, the RNG
    assert got["closed"], got


# An error that ends the run skips `close`: the interpreter's exit must not wait on the writer (multiprocessing's
# exit hook sends SIGTERM, which the writer ignores, then joins it).
UNCLOSED_DRIVER = r"""
import sys
from pathlib import Path
from tests.pretrain.test_checkpoint_writer import _files
from pretrain.checkpoint_writer import WriterProcess
w = WriterProcess()
folder = Path(sys.argv[1])
w.write_and_hash(_files(folder), folder, ["rng.pt"])
print(w.pid, flush=True)
raise SystemExit(3)
"""


@pytest.mark.timeout(120)
def test_an_exit_that_skips_close_does_not_wait_on_the_writer(tmp_path):
    p = subprocess.run([sys.executable, "-c", UNCLOSED_DRIVER, str(tmp_path / "step1")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 3, p.stderr[-3000:]
    assert _gone(int(p.stdout.split()[0]))


# An error ends the run while the save's background thread writes: torch.save calls back into Python for each write,
# and the interpreter stopping a daemon thread inside that call aborted the process (exit 134, or a SIGSEGV, instead of
# the run's own code). The exit hook lets the thread finish first.
EXIT_DRIVER = r"""
import sys, time
from pathlib import Path
import torch
from pretrain import checkpoint as ck
from pretrain.checkpoint_writer import TorchFile
state = {f"w{i}": torch.randn(250_000) for i in range(40)}
folder = Path(sys.argv[1])
folder.mkdir(parents=True)
def work(p):
    for i in range(40):  # seconds of writing: the exit comes in the middle
        TorchFile(folder / f"f{i % 2}.pt", state, atomic=False).write()
ck._pending = ck._Pending("step00000001", folder, "cpu", [], [])
ck._pending.start(work)
time.sleep(0.3)
raise SystemExit(3)
"""


@pytest.mark.timeout(120)
def test_an_error_exit_during_a_background_write_keeps_its_own_exit_code(tmp_path):
    p = subprocess.run([sys.executable, "-c", EXIT_DRIVER, str(tmp_path / "step1")], cwd=ROOT,
                       capture_output=True, text=True, timeout=100)  # fmt: skip
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
    assert torch.load(tmp_path / "step1" / "f0.pt")["w0"].shape == (250_000,)  # the file in hand was finished


@pytest.mark.timeout(30)
def test_the_loop_gets_the_interpreter_lock_back_quickly_while_a_save_finishes(tmp_path):
    """While a save's background part runs Python (torch.save's pickling, the probe's forward, an upload's client),
    the training thread, which gives the lock up in every torch op, gets it back within a short switch interval, not
    CPython's 5 ms; the interval is put back once the background part ends."""
    from pretrain import checkpoint as ckpt
    from pretrain import checkpoint_writer as W

    before = sys.getswitchinterval()
    seen: list[float] = []
    p = ckpt._Pending("step00000001", tmp_path, "cpu", [], [])
    p.start(lambda _: seen.append(sys.getswitchinterval()))
    assert p.thread is not None
    p.thread.join()
    assert seen == [pytest.approx(W.SAVE_SWITCH_INTERVAL_S)] and W.SAVE_SWITCH_INTERVAL_S < before
    assert sys.getswitchinterval() == before
