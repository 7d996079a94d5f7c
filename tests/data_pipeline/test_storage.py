"""RunStore against fsspec's in-memory filesystem (a real fsspec backend, one process): markers go up after the
files they certify, a marker the remote lacks is not trusted, downloads are size-checked and keep the remote
mtime, and paths map to URLs without ever becoming local folders named after a URL."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from core.storage import RunStore, is_marker


@pytest.fixture
def store(tmp_path):
    url = f"memory://t-{uuid.uuid4().hex[:8]}/run"
    yield RunStore(tmp_path / "local", url)
    fsspec.filesystem("memory").rm(url.removeprefix("memory://").split("/")[0], recursive=True)


def test_markers_follow_the_files_they_certify(store):
    d = store.local / "clean/web"
    d.mkdir(parents=True)
    (d / "shard-00000.jsonl.zst").write_bytes(b"data0")
    (d / "shard-00000.done").write_text("{}")
    # an atomic write in flight: never uploaded
    (d / ".shard-00001.jsonl.zst.123.tmp").write_bytes(b"partial")
    (store.local / "checkpoints/step00000004").mkdir(parents=True)
    (store.local / "checkpoints/step00000004/model.pt").write_bytes(b"w")
    (store.local / "checkpoints/step00000004/COMPLETE").write_text("{}")
    (store.local / "checkpoints/latest").write_text("step00000004")
    order = [p.name for p in store.push([store.local / "checkpoints/latest", store.local])]
    assert order.index("shard-00000.jsonl.zst") < order.index("shard-00000.done")
    assert order.index("model.pt") < order.index("COMPLETE") < order.index("latest") == len(order) - 1
    assert not any(n.endswith(".tmp") for n in order)
    assert store.exists(d / "shard-00000.done") and store.url(d) == f"{store.remote}/clean/web"
    assert is_marker("shard-00003.json") and is_marker("_DONE.json") and not is_marker("stats.json")


def test_a_marker_brings_its_shard_even_when_another_task_wrote_it_earlier(store):
    d = store.local / "dedup/web"
    d.mkdir(parents=True)
    (d / "shard-00000.jsonl.zst").write_bytes(b"old")
    old = time.time() - 100
    os.utime(d / "shard-00000.jsonl.zst", (old, old))
    (d / "shard-00000.done").write_text("{}")
    sent = [p.name for p in store.push([store.local / "dedup"], since=time.time() - 10)]
    assert sent == ["shard-00000.jsonl.zst", "shard-00000.done"]


def test_pull_fetches_what_differs_and_distrusts_unuploaded_markers(store, tmp_path):
    src = store.local / "tokens/web"
    src.mkdir(parents=True)
    (src / "shard-00000.bin").write_bytes(b"0123456789")
    (src / "shard-00000.json").write_text('{"docs": 1}')
    store.push([store.local / "tokens"])
    other = RunStore(tmp_path / "other", store.remote)  # another node: an empty staging folder
    got = other.pull([other.local / "tokens"])
    assert sorted(p.name for p in got) == ["shard-00000.bin", "shard-00000.json"]
    assert (other.local / "tokens/web/shard-00000.bin").read_bytes() == b"0123456789"
    assert [p.name for p in other.pull([other.local / "tokens"])] == ["shard-00000.json"]  # markers: always
    # a shard finished here whose upload never happened: its marker is removed, the task counts as not done
    (other.local / "tokens/web/shard-00001.bin").write_bytes(b"x")
    (other.local / "tokens/web/shard-00001.json").write_text("{}")
    other.pull([other.local / "tokens"], prune_markers=True)
    assert not (other.local / "tokens/web/shard-00001.json").exists()
    assert (other.local / "tokens/web/shard-00001.bin").exists()
    assert not other.confirm(other.local / "tokens/web/shard-00001.json")
    assert other.confirm(
        other.local / "tokens/web/shard-00000.json", [other.local / "tokens/web/shard-00000.bin"]
    )
    assert not list(Path.cwd().glob("memory:*"))
