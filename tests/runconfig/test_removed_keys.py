"""Removed config keys (runconfig/removed.py, issue 65 item 7): an old config that still names one at its former
default loads as before, any other value stops the load naming the key and what to do instead, and a checkpoint
written before the removal resumes without a refused change."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from pretrain.checkpoint.resume_diff import compare
from runconfig import load_config
from runconfig.load import to_dict
from runconfig.removed import REMOVED_KEYS, drop_removed_keys
from runconfig.run import RunConfig

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"


def _schema_keys(model: type, prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        out.add(key)
        if isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"):
            out |= _schema_keys(field.annotation, key + ".")
    return out


def test_the_removed_keys_are_gone_from_the_schema():
    live = _schema_keys(RunConfig)
    assert {"objective.type", "tokenizer.max_unk_rate", "shards.workers"} <= live
    assert not [k for k in REMOVED_KEYS if k in live], "a key listed as removed is still in the schema"


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_a_removed_key_at_its_former_default_loads(key: str):
    value = yaml.safe_dump(REMOVED_KEYS[key].default).strip().removesuffix("...").strip()
    cfg = load_config(DEMO, [f"{key}={value}"])
    *parents, leaf = key.split(".")
    section = to_dict(cfg)
    for part in parents:
        section = section[part]
    assert leaf not in section


def test_a_removed_key_set_otherwise_is_refused_naming_what_to_do():
    with pytest.raises(ConfigError) as e:
        load_config(DEMO, ["objective.static_masking=true", "shards.encode_batch_docs=64"])
    text = str(e.value)
    assert "objective.static_masking was removed (True given)" in text
    assert "bench/_static_masking.py" in text
    assert "shards.encode_batch_docs was removed (64 given)" in text and "ENCODE_BATCH_DOCS" in text


def test_an_old_resolved_config_loads_and_the_callers_dict_is_kept():
    """A resolved config names every key it had: one written before the removal still loads."""
    old = to_dict(load_config(DEMO))
    old["objective"]["static_masking"] = False
    old["tokenizer"]["unk_sample_docs"] = 500
    old["tokenizer"]["unk_sample_tokens"] = 100_000
    old["shards"]["encode_batch_docs"] = 256
    kept = copy.deepcopy(old)
    assert to_dict(RunConfig.model_validate(old)) == to_dict(load_config(DEMO))
    assert old == kept
    assert drop_removed_keys(old) is not old


def test_a_checkpoint_written_before_the_removal_resumes():
    """resume_diff compares the checkpoint's recorded config key by key: a removed key at its former default is
    what the product does now, not a change; a checkpoint trained with static masking is a change."""
    now = to_dict(load_config(DEMO))
    before = copy.deepcopy(now)
    before["objective"]["static_masking"] = False
    before["shards"]["encode_batch_docs"] = 256
    changes = compare(before, now, step=10, accept=False)
    assert not changes.refused and not changes.applied
    before["objective"]["static_masking"] = True
    changes = compare(before, now, step=10, accept=True)
    assert [k for k, _, _ in changes.refused] == ["objective.static_masking"]
