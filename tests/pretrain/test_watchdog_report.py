"""Who did not arrive (pretrain/run/watchdog.py): the ranks behind the furthest one, by step, micro-batch and phase,
and the silent ones, named with their hosts (issue 44 item 3). The end-to-end hang is tests/pretrain/test_hang.py."""

from __future__ import annotations

import time

import pytest

from pretrain.run.watchdog import behind, hang_report
from tests.pretrain.steering import DelaySettings, parse_delays

pytestmark = pytest.mark.timeout(30)


def _beat(step, phase, micro=0, host="node-a", age=1.0, silent=0.0):
    now = time.time()
    return {
        "host": host,
        "step": step,
        "micro": micro,
        "phase": phase,
        "since": now - age,
        "updated": now - silent,
    }


def test_the_rank_still_in_its_forward_is_behind_the_one_waiting_in_the_reduction():
    beats = {0: _beat(3, "backward", host="node-a"), 1: _beat(3, "forward", host="node-b", age=42.0)}
    late = behind(beats, time.time(), stale_s=20)
    assert list(late) == [1]
    assert "step 3, in the forward of micro-batch 0, for 42" in late[1]


def test_earlier_step_micro_batch_and_phase_order():
    now = time.time()
    assert list(behind({0: _beat(5, "data"), 1: _beat(4, "after"), 2: _beat(5, "data")}, now, 20)) == [1]
    assert list(behind({0: _beat(5, "forward", micro=2), 1: _beat(5, "backward", micro=1)}, now, 20)) == [1]
    assert list(behind({0: _beat(5, "after"), 1: _beat(5, "backward", micro=7)}, now, 20)) == [1]
    assert behind({0: _beat(5, "after"), 1: _beat(5, "after")}, now, 20) == {}


def test_silent_and_missing_heartbeats_are_named():
    late = behind({0: _beat(2, "backward"), 1: _beat(2, "backward", silent=60.0), 2: None}, time.time(), 20)
    assert sorted(late) == [1, 2]
    assert "silent for 60 s" in late[1] and "no heartbeat" in late[2]


def test_the_report_names_ranks_hosts_and_where_the_stacks_are(tmp_path):
    beats = {0: _beat(3, "backward", host="node-a"), 1: _beat(3, "forward", host="node-b")}
    text = hang_report(beats, "rank 0 made no progress", tmp_path, stale_s=20)
    assert "did not arrive: rank 1 (host node-b): step 3, in the forward" in text
    assert "rank 0 (host node-a): step 3, in the backward" in text
    assert f"{tmp_path}/rank-<N>.txt" in text
    assert "did not arrive" not in hang_report({0: beats[0], 1: dict(beats[0])}, "x", tmp_path, 20)


def test_the_test_delay_callback_reads_its_rank_alone_and_refuses_a_bad_entry():
    """The steering callback (tests/pretrain/steering.py), as the hang tests register it on their runs."""
    assert parse_delays([], 1) == {}
    assert parse_delays(["1:3:60"], 1) == {3: 60.0} and parse_delays(["1:3:60"], 0) == {}
    entries = ["1:*:0.5", "1:3:600", "0:2:1"]
    assert parse_delays(entries, 1) == {None: 0.5, 3: 600.0} and parse_delays(entries, 0) == {2: 1.0}
    assert parse_delays(["1:3:stop"], 1) == {3: float("inf")}  # SIGSTOP itself there (test_hang_suspend.py)
    DelaySettings(delays=entries + ["1:3:stop"])
    with pytest.raises(ValueError, match="'one:3' is not RANK:STEP:SECONDS"):
        DelaySettings(delays=["one:3"])


TEST_ONLY = ("LMSTACK_TEST_DELAY", "LMSTACK_SPIKE_INJECT", "LMSTACK_PARITY_RECORD", "LMSTACK_PARITY_SABOTAGE")


def test_the_product_reads_no_environment_variable_a_test_sets():
    """The product reads no test-only variable (issue 65): the delay and the spike are test callbacks."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for package in ("core", "runconfig", "data_pipeline", "pretrain", "adapt", "launch"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            for name in TEST_ONLY:
                assert name not in text, f"{path}: {name}"


def test_a_straggler_must_exceed_the_median_by_the_factor_and_by_an_absolute_floor():
    """Two CPU ranks of a tiny model step in milliseconds; one 25 ms loader hiccup is 3.5x the other rank but no
    straggler (the floor, pretrain/run/watchdog.py STRAGGLER_MIN_EXCESS_S); a rank a second behind is one."""
    from pretrain.run.watchdog import find_stragglers

    assert find_stragglers([0.010, 0.035], factor=1.5, min_excess_s=0.05) == []
    assert find_stragglers([0.10, 1.10], factor=1.5, min_excess_s=0.05) == [1]
    assert find_stragglers([0.10, 0.12, 0.11, 0.40], factor=1.5, min_excess_s=0.05) == [3]
    assert find_stragglers([0.0, 0.0], factor=1.5, min_excess_s=0.0) == []
