"""Warmup-stable-decay (`schedule.decay: wsd`): warmup, a constant stable phase and a cool-down over the last
`schedule.decay_fraction` of the run in one of three shapes (Hägele et al. 2024), in steps and in elapsed time;
the plan prints its phases; bad settings are refused at load naming the key."""

from __future__ import annotations

import math

import pytest

from pretrain.run.schedule import TimeWarmupDecay, WarmupStableDecay, lr_multiplier, make_plan
from pretrain.tools.plan import plan_report
from runconfig import load_config

pytestmark = pytest.mark.timeout(60)

TINY = "configs/roberta-tiny.yaml"  # 200 steps, 20 warmup


def test_wsd_shape_against_hand_values():
    # warmup 10, stable to step 80, cool-down 80 -> 100 (20 steps) to 0.1 of the peak
    lin = WarmupStableDecay(warmup=10, decay_start=80, total=100, shape="linear", min_ratio=0.1)
    assert lin(0) == pytest.approx(0.1) and lin(9) == pytest.approx(1.0)
    assert lin(10) == lin(50) == lin(79) == 1.0  # the stable phase is flat at the peak
    assert lin(80) == pytest.approx(1.0) and lin(90) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lin(100) == pytest.approx(0.1) and lin(150) == pytest.approx(0.1)
    sq = WarmupStableDecay(10, 80, 100, "1-sqrt", 0.0)
    assert sq(85) == pytest.approx(1 - math.sqrt(0.25)) and sq(95) == pytest.approx(1 - math.sqrt(0.75))
    cos = WarmupStableDecay(0, 50, 100, "cosine", 0.0)
    assert cos(0) == 1.0 and cos(75) == pytest.approx(0.5) and cos(100) == pytest.approx(0.0, abs=1e-12)


def test_wsd_from_the_config_cools_down_over_its_share():
    cfg = load_config(
        TINY, ["schedule.decay=wsd", "schedule.decay_fraction=0.25", "schedule.decay_shape=linear"]
    )
    f = lr_multiplier(cfg, make_plan(cfg, 2))
    assert isinstance(f, WarmupStableDecay) and (f.warmup, f.decay_start, f.total) == (20, 150, 200)
    assert f(149) == 1.0 and f(175) == pytest.approx(0.5)
    # the defaults: a 20% cool-down in the 1-sqrt shape
    d = lr_multiplier(load_config(TINY, ["schedule.decay=wsd"]), make_plan(load_config(TINY), 2))
    assert (d.decay_start, d.shape) == (160, "1-sqrt")


def test_wsd_over_elapsed_time():
    f = TimeWarmupDecay(100.0, 0.1, "wsd", 0.0, decay_fraction=0.2, shape="linear")
    for t, want in ((10.0, 1.0), (50.0, 1.0), (79.0, 1.0), (90.0, 0.5), (100.0, 0.0)):
        f.elapsed_s = t
        assert f(0) == pytest.approx(want), t


def test_the_plan_prints_the_phases():
    cfg = load_config(TINY, ["schedule.decay=wsd", "schedule.decay_fraction=0.2"])
    text = make_plan(cfg, 2).describe()
    assert "warmup to step 20, stable to 160, decay to 200 (1-sqrt, to 0x the peak)" in text, text
    assert plan_report(cfg, 2)["plan"]["phases"].startswith("warmup to step 20")
    # other schedules say theirs
    assert "warmup to step 20, decay to 200 (linear" in make_plan(load_config(TINY), 2).describe()


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["schedule.decay=wsd", "schedule.decay_fraction=1.0"], "schedule.decay_fraction"),
        (["schedule.decay=wsd", "schedule.decay_fraction=0"], "schedule.decay_fraction"),
        (["schedule.decay_fraction=0.2"], "schedule.decay_fraction"),  # without wsd
        (["schedule.decay_shape=1-sqrt"], "schedule.decay_shape"),
        (["schedule.decay=wsd", "schedule.decay_shape=exp"], "schedule.decay_shape"),
        (
            ["schedule.decay=wsd", "schedule.decay_fraction=0.95"],
            "schedule.warmup",
        ),  # decay would eat the warmup
    ],
)
def test_bad_wsd_settings_are_refused_at_load(overrides, key):
    with pytest.raises(Exception, match=key.replace(".", r"\.")):
        load_config(TINY, overrides)
