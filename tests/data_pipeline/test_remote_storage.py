"""Remote inputs through fsspec: a real S3 API (moto in server mode, started and stopped here) and plain HTTP;
URLs are never turned into local folders; a missing fsspec backend names the extra to install."""

from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from pathlib import Path

import pytest

from data_pipeline.clean import run_clean
from runconfig import load_config
from tests.data_pipeline.tokens_fixtures import BBC
from tests.moto_s3 import s3_server  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def test_clean_reads_a_source_from_s3(s3_server, tmp_path):  # noqa: F811
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server["AWS_ENDPOINT_URL"]})
    fs.mkdir("corpus")
    files = sorted((BBC / "tech").glob("*.txt"))[:40]
    for part in range(2):
        rows = [{"text": f.read_text(errors="replace")} for f in files[part::2]]
        with fs.open(f"corpus/bbc/part-{part}.jsonl", "w") as out:
            out.write("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        ROOT / "configs/roberta-tiny.yaml",
        [
            f"run.output_dir={tmp_path}/run",
            "data.clean.workers=2",
            "data.clean.progress=false",
            "data.sources=[{name: bbc, format: jsonl, paths: ['s3://corpus/bbc/*.jsonl']}]",
        ],
    )
    out = run_clean(cfg)
    assert out["complete"] and out["totals"]["read"] == 40 and out["totals"]["kept"] >= 35
    assert len(list((tmp_path / "run/clean/bbc").glob("shard-*.jsonl.zst"))) == 2  # one shard per object
    # Ids come from the path inside the bucket: the same data under another prefix keeps its ids.
    assert not any(p.name.startswith("s3:") for p in Path.cwd().iterdir())


def test_clean_reads_over_http(tmp_path):
    pytest.importorskip("aiohttp", reason="aiohttp (lmstack[http]) not installed")
    root = tmp_path / "www"
    root.mkdir()
    rows = [{"text": f.read_text(errors="replace")} for f in sorted((BBC / "sports").glob("*.txt"))[:10]]
    (root / "sport.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/sport.jsonl"
        cfg = load_config(
            ROOT / "configs/roberta-tiny.yaml",
            [
                f"run.output_dir={tmp_path}/run",
                "data.clean.workers=1",
                "data.clean.progress=false",
                f"data.sources=[{{name: web, format: jsonl, paths: ['{url}']}}]",
            ],
        )
        out = run_clean(cfg)
    finally:
        server.shutdown()
    assert out["totals"]["read"] == 10 and out["totals"]["kept"] >= 8


def test_url_output_dir_is_staged_locally_never_turned_into_a_folder(tmp_path, monkeypatch):
    """The `./memory:/out` bug: a URL output_dir is written through fsspec from a local staging folder
    ($LMSTACK_CACHE/runs/... by default), and no folder named after the URL appears anywhere."""
    import fsspec

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMSTACK_CACHE", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    rows = [{"text": f.read_text(errors="replace")} for f in sorted((BBC / "tech").glob("*.txt"))[:6]]
    (tmp_path / "src/a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        ROOT / "configs/roberta-tiny.yaml",
        [
            "run.output_dir=memory://out",
            "data.clean.workers=1",
            "shards.workers=1",
            "data.clean.progress=false",
            f"data.sources=[{{name: web, format: jsonl, paths: ['{tmp_path}/src/a.jsonl']}}]",
        ],
    )
    assert cfg.run.output_dir == "memory://out" and cfg.run.is_remote
    assert Path(cfg.run.root).is_relative_to(tmp_path / "cache/runs")
    try:
        out = run_clean(cfg)
        fs = fsspec.filesystem("memory")
        assert out["totals"]["read"] == 6
        assert fs.exists("/out/clean/web/shard-00000.jsonl.zst") and fs.exists(
            "/out/clean/web/shard-00000.done"
        )
        assert fs.exists("/out/clean/stats.json")
    finally:
        fsspec.filesystem("memory").rm("/out", recursive=True)
    assert sorted(os.listdir(tmp_path)) == ["cache", "src"]  # no ./memory:/out
    assert not list(Path(cfg.run.root).parent.parent.rglob("memory:*"))
    with pytest.raises(
        Exception, match=r"run.local_dir: .*'s3://b/x' is a URL; the staging folder must be a local"
    ):
        load_config(ROOT / "configs/roberta-tiny.yaml", ["run.output_dir=s3://b/r", "run.local_dir=s3://b/x"])
    with pytest.raises(
        Exception,
        match=r"data.clean.workers: 2 worker processes cannot write to run.output_dir "
        r"'memory://out'",
    ):
        load_config(
            ROOT / "configs/roberta-tiny.yaml",
            ["run.output_dir=memory://out", "data.clean.workers=2", "shards.workers=1"],
        )
    assert load_config(
        ROOT / "configs/roberta-tiny.yaml", [f"run.output_dir=file://{tmp_path}/r"]
    ).run.output_dir == (f"{tmp_path}/r")


def test_missing_backend_names_the_extra():
    from core.paths import expand_paths

    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed: no missing backend to report")
    except ImportError:
        pass
    with pytest.raises(
        ImportError,
        match=r"gs://bucket/x.jsonl: reading gs:// paths needs its fsspec backend: "
        r"pip install 'lmstack\[gcs\]'",
    ):
        expand_paths(["gs://bucket/x.jsonl"])
