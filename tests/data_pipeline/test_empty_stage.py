"""An input that yields nothing is reported, an empty cleaned corpus stops tokenizer training naming the empty
stage (BPE and Unigram), and temporary files of a killed write are removed by the next run (issue 12, 11-12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.clean import run_clean
from data_pipeline.tokenizers import train_tokenizer
from data_pipeline.tokenizers.corpus import EmptyStageError
from runconfig import load_config
from tests.data_pipeline.test_bad_input import bbc_texts

ROOT = Path(__file__).resolve().parents[2]
NO_FILTERS = {
    "workers": 1,
    "progress": False,
    "c4": {"enabled": False},
    "gopher_quality": {"enabled": False},
    "gopher_repetition": {"enabled": False},
    "langid": {"enabled": False},
}


def _config(tmp_path: Path, family: str, source: dict) -> Path:
    path = tmp_path / f"{family}.yaml"
    path.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / f"configs/{family}-tiny.yaml")],
                "run": {"output_dir": str(tmp_path / "out")},
                "data": {"sources": [source], "clean": NO_FILTERS},
                "tokenizer": {"vocab_size": 600},  # >= 512: room for the byte-fallback Unigram pieces
            }
        )
    )
    return path


@pytest.mark.parametrize("family", ["roberta", "t5"])  # byte-level BPE and Unigram
def test_one_byte_warc_is_reported_and_empty_corpus_stops_tokenizer(tmp_path, family):
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    (crawl / "tiny.warc.gz").write_bytes(b"\x1f")
    yaml = _config(tmp_path, family, {"name": "crawl", "format": "warc", "paths": [str(crawl / "*.warc.gz")]})
    cfg = load_config(yaml)
    run_clean(cfg)
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    assert stats["bad_records_by_kind"] == {"truncated_or_corrupt_file": 1}, stats["bad_records_by_kind"]
    with pytest.raises(EmptyStageError, match=r"the 'clean' stage kept no text: its 1 finished shard\(s\)"):
        train_tokenizer(cfg)
    assert not (tmp_path / "out/tokenizer").exists()

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run(
        [sys.executable, "-m", "data_pipeline", "train-tokenizer", "--config", str(yaml)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1 and "error: tokenizer training: the 'clean' stage kept no text" in res.stderr
    assert "Traceback" not in res.stderr, res.stderr[-2000:]


def test_orphaned_shard_temp_files_are_removed_on_the_next_run(tmp_path):
    news = tmp_path / "texts" / "news"
    news.mkdir(parents=True)
    for i, text in enumerate(bbc_texts(3)):
        (news / f"{i}.txt").write_text(text)
    cfg = load_config(
        _config(
            tmp_path, "roberta", {"name": "bbc", "format": "text_folder", "paths": [str(tmp_path / "texts")]}
        )
    )
    shard_dir = tmp_path / "out/clean/bbc"
    shard_dir.mkdir(parents=True)
    # what a SIGKILL during the shard write and during its marker write leaves behind
    orphans = [shard_dir / ".shard-00000.jsonl.zst.k1ll3d.tmp", shard_dir / ".shard-00000.done.x9y8z7.tmp"]
    for p in orphans:
        p.write_bytes(b"half a shard")
    run_clean(cfg)
    assert not list((tmp_path / "out").rglob("*.tmp")), list((tmp_path / "out").rglob("*.tmp"))
    assert (shard_dir / "shard-00000.done").is_file()
