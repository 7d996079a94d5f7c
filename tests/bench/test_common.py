"""bench/_common.Report: medians of paired alternating rounds decide pass/fail; quick runs are never saved."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _common as C  # noqa: E402


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "RESULTS", tmp_path)
    return tmp_path


def test_alternate_runs_ours_then_peer_each_round():
    calls = []
    o, p = C.alternate(lambda: calls.append("o") or 1.0, lambda: calls.append("p") or 2.0, 3)
    assert calls == ["o", "p"] * 3 and o == [1.0] * 3 and p == [2.0] * 3


def test_verdict_is_the_median_of_paired_ratios_and_can_fail(results, capsys):
    rep = C.Report("bench/example.py")
    # one noisy round (ratio 5) must not carry the verdict: per-round ratios 1, 1, 1, 1, 5 -> median 1
    ok = rep.compare("speed", [10, 10, 10, 10, 50], [10, 10, 10, 10, 10], 1.1)
    assert not ok and rep.verdicts[-1].endswith(" fail") and "ratio=1 " in rep.verdicts[-1]
    assert rep.compare("latency", [5, 5, 5, 5, 5], [10, 10, 10, 10, 10], 1.0, lower_is_better=True)
    assert rep.verdicts[-1].startswith(
        "VERDICT latency_lower_is_better: ours=5 peer=10 ratio=0.5 goal=1 pass"
    )
    assert rep.finish() == 1  # a fail is the exit code
    text = (results / "example.txt").read_text()
    assert text.startswith("# bench/example.py: written by the script itself")
    for field in ("command: ", "commit: ", "date: ", "machine: ", "load average at start"):
        assert field in text
    assert text.rstrip().splitlines()[-2:] == rep.verdicts
    assert "min 10, max 50" in text


def test_quick_run_prints_verdicts_but_writes_nothing(results, capsys):
    rep = C.Report("bench/example.py")
    rep.compare("speed", [3.0, 3.0], [1.0, 1.0], 2.0)
    assert rep.finish() == 0
    assert not (results / "example.txt").exists()
    assert "VERDICT speed: ours=3 peer=1 ratio=3 goal=2 pass" in capsys.readouterr().out


def test_dedup_scale_json_carries_command_commit_date_machine(tmp_path, monkeypatch):
    """dedup_scale.json is written outside `Report`; it must still say where and from what it came."""
    import dedup_scale

    monkeypatch.setattr(dedup_scale, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["bench/dedup_scale.py", "--quick"])
    dedup_scale.PROVENANCE.update(C.provenance())
    dedup_scale._save([], {}, ["VERDICT x: ours=1 peer=1 ratio=1 goal=1 pass"], {}, complete=True)
    saved = json.loads((tmp_path / "dedup_scale.json").read_text())
    assert saved["command"].endswith("bench/dedup_scale.py --quick") and saved["commit"] and saved["date"]
    assert "cores, load average at start" in saved["machine"]


def test_results_written_earlier_in_the_same_bench_run_do_not_mark_the_tree_dirty(tmp_path, monkeypatch):
    """`make bench` runs the scripts one after another: the results files the first ones rewrote are outputs, not
    uncommitted code, so later scripts must still name a clean commit (a changed source file still counts)."""
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "a.txt").write_text("old\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    monkeypatch.setattr(C, "ROOT", tmp_path)
    (tmp_path / "bench" / "results" / "a.txt").write_text("new\n")
    assert "uncommitted" not in C._git_commit()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert C._git_commit().endswith(" + uncommitted changes")


def test_a_variant_run_writes_its_own_results_file(results, capsys):
    """A partial run (one recipe of bench/transfer.py) must not overwrite the full run's results file."""
    full = C.Report("bench/example.py")
    full.verdict("loss", 1.0, 1.0, 1.0)
    full.finish()
    part = C.Report("bench/example.py", variant="t5-budget")
    part.verdict("loss", 2.0, 1.0, 1.0)
    part.finish()
    assert "ours=1 " in (results / "example.txt").read_text()
    assert "ours=2 " in (results / "example-t5-budget.txt").read_text()


def test_transfer_names_partial_runs_by_their_recipes_and_budget():
    import transfer

    assert transfer.results_variant(transfer.RECIPES, 8.0) is None
    assert transfer.results_variant(["t5-budget"], 8.0) == "t5-budget"
    assert transfer.results_variant(transfer.RECIPES, 4.0) == "4min"
    assert transfer.results_variant(["t5-budget", "gpt2-budget"], 2.5) == "t5-budget_gpt2-budget-2.5min"
    assert transfer.results_variant(["t5-budget"], 3.0, gpu=True) == "t5-budget-3min-gpu"


def test_transfer_gpu_run_config_pretrains_on_one_nccl_rank(tmp_path):
    """--gpu: the recipe's own config (2 gloo ranks on CPU) becomes one NCCL rank, and still validates."""
    import transfer

    from runconfig import load_config

    for gpu, procs, backend in ((False, 2, "gloo"), (True, 1, "nccl")):
        cfg = tmp_path / f"run-{gpu}.yaml"
        cfg.write_text(transfer.run_yaml("t5-budget", tmp_path / "run", 2.0, tmp_path, False, gpu))
        c = load_config(cfg)
        assert (c.launch.procs_per_node, c.launch.backend) == (procs, backend)
        assert c.schedule.budget_minutes == 2.0
