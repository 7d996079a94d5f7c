"""Suite-wide: `make test` runs on 2 pytest-xdist workers (`--dist loadgroup`). Tests that start machine-wide
services (the local Slurm cluster, network namespaces with fixed names, a Ray head) share one group, so one worker
runs them one after another while the other worker runs the rest. Long tests are handed out first (longest-
processing-time-first): collected in path order, the 17-minute chaos test started late and left one core busy
alone for the last ~10 minutes of the run."""

from __future__ import annotations

import pytest

SERIAL_MARKERS = ("slurm", "netns", "ray")


def pytest_itemcollected(item):
    """Per item at collection, before any `pytest_collection_modifyitems` (xdist's reads the group there)."""
    if any(item.get_closest_marker(m) for m in SERIAL_MARKERS):
        item.add_marker(pytest.mark.xdist_group("machine-services"))


# Seconds each long test took in CI (2 workers, fresh clone): a scheduling hint only, it changes no test. A test
# not listed counts as short; re-measure with `make test` (it prints the 25 slowest) when the list drifts.
LONG_TESTS = {
    "tests/pretrain/test_chaos.py::test_twenty_sigkills_then_bit_exact": 1040,
    "tests/pretrain/test_exact_resume.py::test_sigkill_anywhere_then_resume_is_bit_exact": 280,
    "tests/pretrain/test_electra.py::test_electra_trains_resumes_and_exports_both_networks": 200,
    "tests/pretrain/test_resume_safety.py::test_damaged_checkpoints_fall_back_then_stop_without_requeue": 190,
    "tests/pretrain/test_compile.py::test_compiled_engine_trains_like_eager_and_exports": 165,
    "tests/pretrain/test_world_size_model.py::test_two_to_one_to_two_ranks_matches_uninterrupted_run": 160,
    "tests/pretrain/test_resume_safety.py::test_config_changes_on_resume_are_applied_or_refused": 155,
    "tests/pretrain/test_train_deepspeed.py::test_roberta_zero2_train_checkpoint_resume_export": 135,
    "tests/pretrain/test_time_budget.py::test_budget_clock_survives_preemption_and_resume": 120,
}


def pytest_collection_modifyitems(config, items):
    """Longest first; the sort is stable, so everything else keeps pytest's order."""
    items.sort(key=lambda item: -LONG_TESTS.get(item.nodeid.split("[")[0].split("@")[0], 0))
