"""A misspelled `model.options` or `objective.options` key of any registered family or objective fails at load,
naming the key and the keys that family (objective) takes; one that takes none says so (issue 47, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.registry import FAMILIES, OBJECTIVES
from runconfig import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def _tiny(family: str) -> str:
    return str(ROOT / "configs" / f"{family}-tiny.yaml")


@pytest.mark.parametrize("family", FAMILIES.names())
def test_misspelled_model_option_names_key_and_valid_keys(family):
    spec = FAMILIES.get(family)
    keys = sorted(spec.options.model_fields) if spec.options is not None else []
    typo = (keys[0] + "s") if keys else "local_attention"
    with pytest.raises(ConfigError) as e:
        load_config(_tiny(family), [f"model.options={{{typo}: 1}}"])
    msg = str(e.value)
    assert f"model.options.{typo}" in msg or f"got ['{typo}']" in msg, msg
    assert f"'{family}'" in msg, msg
    if keys:
        assert all(k in msg for k in keys), f"{msg} should list {keys}"
    else:
        assert "takes no options" in msg, msg


@pytest.mark.parametrize("objective", OBJECTIVES.names())
def test_misspelled_objective_option_names_key_and_valid_keys(objective):
    family = next(f for f in FAMILIES.names() if objective in FAMILIES.get(f).objectives)
    spec = OBJECTIVES.get(objective)
    keys = sorted(spec.options.model_fields) if spec.options is not None else []
    typo = (keys[0] + "s") if keys else "temperature"
    with pytest.raises(ConfigError) as e:
        load_config(_tiny(family), [f"objective.options={{{typo}: 1}}"])
    msg = str(e.value)
    assert f"objective.options.{typo}" in msg or f"got ['{typo}']" in msg, msg
    assert f"'{objective}'" in msg, msg
    if keys:
        assert all(k in msg for k in keys), f"{msg} should list {keys}"
    else:
        assert "takes no options" in msg, msg
