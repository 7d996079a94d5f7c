"""Who did not arrive (pretrain/watchdog.py): the ranks behind the furthest one, by step, micro-batch and phase,
and the silent ones, named with their hosts (issue 44 item 3). The end-to-end hang is tests/pretrain/test_hang.py."""

from __future__ import annotations

import time

import pytest

from pretrain.watchdog import DELAY_ENV, behind, hang_report, injected_delay

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


def test_the_test_only_delay_is_read_for_its_rank_alone(monkeypatch):
    monkeypatch.delenv(DELAY_ENV, raising=False)
    assert injected_delay(1) == {}
    monkeypatch.setenv(DELAY_ENV, "1:3:60")
    assert injected_delay(1) == {3: 60.0} and injected_delay(0) == {}
    monkeypatch.setenv(DELAY_ENV, "1:*:0.5, 1:3:600, 0:2:1")
    assert injected_delay(1) == {None: 0.5, 3: 600.0} and injected_delay(0) == {2: 1.0}
    monkeypatch.setenv(DELAY_ENV, "1:3:stop")  # SIGSTOP itself there (tests/pretrain/test_hang_suspend.py)
    assert injected_delay(1) == {3: float("inf")} and injected_delay(0) == {}
    monkeypatch.setenv(DELAY_ENV, "one:3")
    with pytest.raises(ValueError, match=DELAY_ENV):
        injected_delay(1)


def test_a_straggler_must_exceed_the_median_by_the_factor_and_by_an_absolute_floor():
    """Two CPU ranks of a tiny model step in milliseconds; one 25 ms loader hiccup is 3.5x the other rank but no
    straggler (the floor, watchdog.straggler_min_excess_s); a rank a second behind is one."""
    from pretrain.watchdog import find_stragglers

    assert find_stragglers([0.010, 0.035], factor=1.5, min_excess_s=0.05) == []
    assert find_stragglers([0.10, 1.10], factor=1.5, min_excess_s=0.05) == [1]
    assert find_stragglers([0.10, 0.12, 0.11, 0.40], factor=1.5, min_excess_s=0.05) == [3]
    assert find_stragglers([0.0, 0.0], factor=1.5, min_excess_s=0.0) == []
