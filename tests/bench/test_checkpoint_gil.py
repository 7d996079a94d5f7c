"""bench/checkpoint_gil.py (issue 44): the loop it times runs beside the background it is given, which really
writes (each write counted), and a short run prints its VERDICT without writing bench/results (fewer than 5 rounds)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import checkpoint_gil as G  # noqa: E402


@pytest.mark.timeout(60)
def test_the_loop_runs_beside_a_background_that_writes(tmp_path):
    writes: list[int] = []

    def background(stop: threading.Event) -> None:
        writes.append(1)
        stop.wait(0.01)

    rate, done = G.loop_rate(0.3, background)
    assert rate > 0 and done == len(writes) >= 2
    idle, none = G.loop_rate(0.3, None)
    assert idle > 0 and none == 0


@pytest.mark.timeout(120)
def test_a_quick_run_prints_its_verdict_and_writes_no_results(monkeypatch, capsys):
    before = {p: p.stat().st_mtime for p in G.C.RESULTS.glob("checkpoint_gil*.txt")}
    monkeypatch.setattr(sys, "argv", ["checkpoint_gil.py", "--rounds", "1", "--seconds", "0.2", "--mb", "2"])
    G.main()
    out = capsys.readouterr().out
    assert "VERDICT checkpoint_write_loop_speed_vs_idle: ours=" in out and "goal=0.8" in out
    assert "quick run" in out
    assert {p: p.stat().st_mtime for p in G.C.RESULTS.glob("checkpoint_gil*.txt")} == before
