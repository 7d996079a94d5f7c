"""bench/checkpoint_stall.py (issue 44): the runs it compares share their settings, and `--gpu` runs one CUDA rank
over NCCL (the background part then has the host's idle cores, as on a GPU node) with settings that validate as
written; the stall of a save is the step after it against the median of the steps after no save."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import checkpoint_stall as S  # noqa: E402


@pytest.mark.parametrize(
    "gpu, cpu_ranks, expected", [(False, 2, (2, "gloo")), (False, 1, (1, "gloo")), (True, 2, (1, "nccl"))]
)
def test_overrides_validate_and_pick_the_ranks(gpu, cpu_ranks, expected):
    from runconfig import load_config

    global_batch, micro = S.recipe_batch("gpt2-budget")
    assert (global_batch, micro) == (32, 16)  # the demo recipe's own step
    for batch in (global_batch, 8):  # the recipe's, and a smaller step (--global-batch 8)
        overrides = S.base_overrides(36, 6, gpu, cpu_ranks, batch, micro)
        cfg = load_config(S.C.ROOT / "configs" / "gpt2-budget.yaml", overrides)
        assert cfg.schedule.total_steps == 36 and cfg.checkpoint.every_steps == 6
        assert (cfg.launch.procs_per_node, cfg.launch.backend) == expected
        # the same work per step whatever the ranks
        assert cfg.batch_plan()["global_batch_size"] == batch


def test_stall_is_the_step_after_each_save_against_the_steps_after_none():
    times = {s: 0.2 for s in range(1, 19)} | {7: 0.25, 13: 0.3}  # saves at 6 and 12; 18 is the last step
    st, normal = S.stalls(times, 18, 6)
    assert normal == pytest.approx(0.2) and st == pytest.approx([0.05, 0.1])


def test_interval_excess_counts_what_spills_past_the_checkpoint_step():
    # saves at 6 and 12 of 18; the first save's background part spills into the step after its checkpoint step
    times = {s: 0.2 for s in range(1, 19)} | {7: 0.25, 8: 0.3, 13: 0.22}
    st, normal = S.stalls(times, 18, 6)
    assert st == pytest.approx([0.05, 0.02])  # the stall sees the checkpoint step only
    assert S.interval_excess(times, 18, 6, normal) == pytest.approx([0.15, 0.02])
