"""Issue 66: an unknown key got no "did you mean" where no spelling was close (`optim.learning_rate=1`, the name
every other trainer uses for `optim.lr`): the error names the closest valid keys of the section, by spelling or by
the key's initials, and lists the section's keys where nothing is close."""

from __future__ import annotations

from pathlib import Path

import pytest

from runconfig import ConfigError, load_config

TINY = Path(__file__).resolve().parents[2] / "configs" / "roberta-tiny.yaml"


@pytest.mark.parametrize(
    "override, line",
    [
        ("optim.learning_rate=1", "optim.learning_rate: unknown key; did you mean 'lr'?"),
        ("schedule.warmup_stpes=3", "schedule.warmup_stpes: unknown key; did you mean 'warmup_steps'?"),
        (
            "optim.momentum=0.9",
            "optim.momentum: unknown key (optim takes: betas, eps, grad_clip, lr, name, weight_decay)",
        ),
    ],
)
def test_an_unknown_key_names_the_closest_valid_keys(override, line):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [override])
    assert line in str(err.value).splitlines()[1], str(err.value)
