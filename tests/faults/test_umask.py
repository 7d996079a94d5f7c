"""Issue 25 row 10 / item 7: outputs follow the user's umask (0644 under 022) like any file tool: a cleaned
shard (written through mkstemp, 0600 before), and the export's model.safetensors and a checkpoint file (in the
integration test of test_export_faults)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.data_pipeline.test_clean import make_cfg


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_cleaned_shards_and_markers_are_0644_under_umask_022(tmp_path, umask_022):
    from data_pipeline.clean import run_clean

    cfg = make_cfg(tmp_path)
    run_clean(cfg)
    files = [p for p in (tmp_path / "out" / "clean").rglob("*") if p.is_file()]
    shards = [p for p in files if p.name.startswith("shard-") and p.name.endswith(".zst")]
    assert shards
    assert {p.name: oct(mode(p)) for p in files} == {p.name: "0o644" for p in files}


def test_outputs_follow_a_stricter_umask_too(tmp_path):
    from data_pipeline.shards import write_json_atomic

    old = os.umask(0o077)
    try:
        write_json_atomic(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    assert mode(tmp_path / "x.json") == 0o600
