"""Issue 25 row 3 / item 4: every config value that becomes a path component (source names, fine-tune task
names, run.name) is refused at load when it could leave its folder: separators, `..`, absolute paths."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.preflight import check_output_writable
from runconfig import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs/demo.yaml")

BAD = ["../../../escaped", "a/b", "/abs", "..", ".", "a\\b", "", "x\x00y"]


@pytest.mark.parametrize("bad", BAD)
def test_source_name_that_leaves_its_folder_is_refused(bad):
    with pytest.raises(ConfigError) as e:
        load_config(DEMO, [f"data.sources.0.name={bad!r}" if bad else "data.sources.0.name=''"])
    msg = str(e.value)
    assert "data.sources.0.name" in msg and "path component" in msg


@pytest.mark.parametrize("key", ["run.name", "finetune.tasks.0.name"])
@pytest.mark.parametrize("bad", ["../escaped", "a/b", "/abs"])
def test_run_and_task_names_that_leave_their_folder_are_refused(key, bad, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"inherit: [{DEMO}]\nfinetune:\n  tasks:\n  - {{name: t, train: {tmp_path}/x.csv}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg, [f"{key}={bad!r}"])
    assert key in str(e.value) and "path component" in str(e.value)


def test_ordinary_names_still_load():
    cfg = load_config(DEMO, ["data.sources.0.name=web-2024_v1.2", "run.name=my.run"])
    assert cfg.data.sources[0].name == "web-2024_v1.2"


def test_a_write_probe_left_by_a_killed_run_is_removed_by_the_next_check(tmp_path):
    """The soak's kill during the writable check left `<run>/.write-test-*` behind for good (CI, session 13)."""
    run = tmp_path / "run"
    run.mkdir()
    dead, live = run / ".write-test-dead", run / ".write-test-live"
    dead.write_text("")
    live.write_text("")
    old = time.time() - 3600
    os.utime(dead, (old, old))
    check_output_writable(load_config(DEMO, [f"run.output_dir={run}"]))
    assert not dead.exists() and live.exists()  # a probe of a run checking right now is left alone


_PROBE_LOOP = """
import sys
from core.preflight import check_output_writable
from runconfig import load_config
cfg = load_config(sys.argv[1], ["run.output_dir=" + sys.argv[2]])
print("ready", flush=True)
while True:
    check_output_writable(cfg)
"""


def test_a_kill_during_the_writable_check_leaves_no_probe_behind(tmp_path):
    """The 60-second sweep above cannot help a rerun that starts at once: the soak's last run came seconds
    after a SIGKILL inside the check and still found `.write-test-*` (CI, session 16). The probe must never
    have a name in the folder, so a kill at any instant leaves nothing."""
    run = tmp_path / "run"
    run.mkdir()
    rng = random.Random(0)
    for _ in range(15):
        p = subprocess.Popen(
            [sys.executable, "-c", _PROBE_LOOP, DEMO, str(run)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.01, 0.2))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        left = [q.name for q in run.iterdir()]
        assert not left, f"a SIGKILL during the writable check left {left}"
