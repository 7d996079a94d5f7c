"""The watchdog keys (issue 44 items 3-4) are refused at load, naming the key, when they cannot work."""

from __future__ import annotations

import pytest

from runconfig import ConfigError, load_config

pytestmark = pytest.mark.timeout(60)
TINY = "configs/gpt2-tiny.yaml"


def test_defaults_and_a_valid_setting_load():
    cfg = load_config(TINY)
    assert cfg.watchdog.enabled and cfg.watchdog.hang_timeout_s is None and cfg.watchdog.straggler_factor > 1
    cfg = load_config(
        TINY, ["deepspeed.comm_timeout_s=60", "watchdog.hang_timeout_s=45", "watchdog.straggler_factor=1.2"]
    )
    assert (cfg.watchdog.hang_timeout_s, cfg.watchdog.straggler_factor) == (45, 1.2)


@pytest.mark.parametrize("factor", ["1", "1.0", "0.5", "-2"])
def test_a_straggler_factor_at_or_below_one_is_refused_naming_the_key(factor):
    with pytest.raises(ConfigError, match=r"watchdog\.straggler_factor: .* must be > 1"):
        load_config(TINY, [f"watchdog.straggler_factor={factor}"])


@pytest.mark.parametrize("hang", ["60", "90"])
def test_a_hang_timeout_not_below_the_collective_timeout_is_refused(hang):
    with pytest.raises(
        ConfigError, match=r"watchdog\.hang_timeout_s: .* below deepspeed\.comm_timeout_s \(60\)"
    ):
        load_config(TINY, ["deepspeed.comm_timeout_s=60", f"watchdog.hang_timeout_s={hang}"])


@pytest.mark.parametrize(
    "key", ["watchdog.hang_timeout_s=0", "watchdog.heartbeat_s=0", "watchdog.heartbeat_s=-1"]
)
def test_non_positive_times_are_refused_naming_the_key(key):
    with pytest.raises(ConfigError, match=key.split("=")[0].replace(".", r"\.")):
        load_config(TINY, [key])
