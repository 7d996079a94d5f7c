"""bench/clean_memory.py --smoke: two tiny sources through every filter in a worker pool; each planted kind is
dropped or redacted, each process's peak RSS is read, and the growth VERDICT is printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import _common as C  # noqa: E402


@pytest.mark.integration  # two clean stages in their own processes: ~15 s alone, a minute on a loaded 2-core host
@pytest.mark.timeout(300)
def test_smoke_measures_every_process_and_catches_every_planted_kind(tmp_path):
    res = subprocess.run(
        [sys.executable, "bench/clean_memory.py", "--smoke", "--work", str(tmp_path)],
        cwd=ROOT,
        env=C.child_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "a planted kind was not dropped" not in out, out
    for size in ("0.5", "1"):
        counts = next(ln for ln in out.splitlines() if ln.startswith(f"{size} MB:") and "dropped" in ln)
        for kind in ("decontaminated", "url:domain", "pii:email", "pii:ipv4", "pii:phone"):
            assert re.search(rf"{kind} [1-9]", counts), counts
        rss = next(ln for ln in out.splitlines() if ln.startswith(f"{size} MB: peak RSS"))
        workers = re.search(
            r"workers \[([0-9, ]+)\] MB", rss
        )  # the pool ran (several tasks), each one measured
        assert workers and all(float(w) > 50 for w in workers.group(1).split(",")), rss
    verdict = re.search(
        r"VERDICT clean_peak_rss_growth_0.5mb_to_1mb_lower_is_better: ours=(\d+) peer=(\d+)", out
    )
    assert verdict and int(verdict.group(1)) > 50 and int(verdict.group(2)) > 50, out
    assert (
        not (ROOT / "bench/results/clean_memory.txt").exists()
        or "--smoke" not in (ROOT / "bench/results/clean_memory.txt").read_text()
    )
