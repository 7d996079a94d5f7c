"""Issue 66 item 2: an input file edited in place was not cleaned again: its shard's marker matched the settings
and filter code, so the old shard was reused (`"read": 1`, `"shards_skipped_done": 1`, no "redoing" line) and the
new text never reached training. A marker now records each input's size and modification time, and a changed
input redoes its shard, named, for every reader kind."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from data_pipeline.clean import run_clean
from data_pipeline.shards import read_shard
from runconfig import load_config
from tests.data_pipeline.test_bad_input import as_html, bbc_texts, warc_member
from tests.data_pipeline.test_empty_stage import NO_FILTERS as NO_QUALITY_FILTERS

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
NO_FILTERS = {**NO_QUALITY_FILTERS, "fineweb": {"enabled": False}}


def _texts(n: int) -> list[str]:
    return bbc_texts(n, topic="tech")


def _jsonl(path: Path, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _delimited(path: Path, texts: list[str], sep: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=sep)
        w.writerow(["text"])
        w.writerows([t] for t in texts)


def _parquet(path: Path, texts: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), path)


def _warc(path: Path, texts: list[str]) -> None:
    path.write_bytes(
        b"".join(
            warc_member(f"https://news.example/{i}", as_html(t).encode(), "text/html; charset=utf-8")
            for i, t in enumerate(texts)
        )
    )


def _text(path: Path, texts: list[str]) -> None:
    path.write_text(texts[-1])  # one document a file: an edit rewrites it


# format -> (file name, writer of that file from a list of texts, documents read before and after the edit)
KINDS: dict[str, tuple[str, Callable[[Path, list[str]], None], tuple[int, int]]] = {
    "jsonl": ("x.jsonl", _jsonl, (1, 2)),
    "csv": ("x.csv", lambda p, t: _delimited(p, t, ","), (1, 2)),
    "tsv": ("x.tsv", lambda p, t: _delimited(p, t, "\t"), (1, 2)),
    "parquet": ("x.parquet", _parquet, (1, 2)),
    "warc": ("x.warc.gz", _warc, (1, 2)),
    "text": ("x.txt", _text, (1, 1)),
    "text_folder": ("docs/x.txt", _text, (1, 1)),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_input_edited_in_place_is_cleaned_again(tmp_path, kind):
    name, write, (before, after) = KINDS[kind]
    data = tmp_path / "data"
    path = data / name
    path.parent.mkdir(parents=True)
    texts = _texts(2)
    write(path, texts[:1])
    pattern = str(path.parent) if kind == "text_folder" else str(path)
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/gpt2-tiny.yaml")],
                "run": {"output_dir": str(tmp_path / "out")},
                "data": {"sources": [{"name": "x", "format": kind, "paths": [pattern]}], "clean": NO_FILTERS},
                "finetune": {"tasks": []},
            }
        )
    )
    cfg = load_config(str(cfg_path))
    first = run_clean(cfg)
    assert first["totals"]["read"] == before, first
    assert run_clean(cfg)["shards_skipped_done"] == 1  # unchanged: reused

    stat = path.stat()
    write(path, texts)  # edited in place: appended to, or rewritten with other text
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later time even on a coarse clock
    second = run_clean(cfg)
    assert second["shards_skipped_done"] == 0 and second["shards_run"] == 1, second
    assert second["totals"]["read"] == after, second
    # the log's "clean: redoing 1 finished shard(s) of x: ..." line, as the summary counts it
    (why,) = second["shards_redone"]
    assert why.startswith(f"x: input changed since it was cleaned: {path}"), second["shards_redone"]
    cleaned = " ".join(
        r["text"] for p in (tmp_path / "out" / "clean" / "x").glob("shard-*.jsonl.zst") for r in read_shard(p)
    )
    assert texts[1].split("\n")[0] in cleaned  # the new text is what the cleaned shard holds now


def test_an_input_rewritten_with_the_same_bytes_keeps_its_shard(tmp_path):
    """A newer time alone (a copy, a regenerated file with the same text) is not an edit: the small file's
    content hash in the marker says it is the same input, and the shard is reused."""
    path = tmp_path / "x.jsonl"
    _jsonl(path, _texts(1))
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/gpt2-tiny.yaml")],
                "run": {"output_dir": str(tmp_path / "out")},
                "data": {
                    "sources": [{"name": "x", "format": "jsonl", "paths": [str(path)]}],
                    "clean": NO_FILTERS,
                },
                "finetune": {"tasks": []},
            }
        )
    )
    cfg = load_config(str(cfg_path))
    run_clean(cfg)
    stat = path.stat()
    _jsonl(path, _texts(1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = run_clean(cfg)
    assert again["shards_skipped_done"] == 1 and again["shards_redone"] == {}, again
