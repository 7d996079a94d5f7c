"""logging.profile_steps is a window of the run's steps, refused at load naming the key otherwise."""

from __future__ import annotations

import pytest

from runconfig import ConfigError, load_config

pytestmark = pytest.mark.timeout(60)


def test_a_window_inside_the_run_loads():
    cfg = load_config("configs/gpt2-tiny.yaml", ["schedule.total_steps=20", "logging.profile_steps=[5,8]"])
    assert cfg.logging.profile_steps == (5, 8)
    assert load_config("configs/gpt2-tiny.yaml", ["schedule.total_steps=20"]).logging.profile_steps is None


@pytest.mark.parametrize("window", ["[8,5]", "[5,5]", "[0,3]", "[-2,3]", "[15,30]"])
def test_a_window_outside_the_run_is_refused_naming_the_key(window):
    with pytest.raises(ConfigError, match="logging.profile_steps"):
        load_config("configs/gpt2-tiny.yaml", ["schedule.total_steps=20", f"logging.profile_steps={window}"])
