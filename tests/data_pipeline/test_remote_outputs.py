"""A run folder in a bucket: the data path (clean -> dedup -> tokenizer -> tokenize) reads its sources from and
writes its outputs to s3:// on a real S3 API (moto in server mode), through a local staging folder. A task is done
only when its marker exists remotely: a fresh staging folder (another node) redoes nothing, and a task whose
upload never finished is redone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.clean import run_clean
from data_pipeline.dedup import run_dedup
from data_pipeline.tokenize import run_tokenize
from runconfig import load_config
from tests.data_pipeline.tokens_fixtures import BBC
from tests.moto_s3 import s3_server, s3fs_client  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def _config(tmp_path: Path, stage: str, extra: list[str] = ()):
    return [
        "run.output_dir=s3://runs/r1",
        f"run.local_dir={tmp_path / stage}",
        "data.clean.workers=2",
        "data.clean.progress=false",
        "data.clean.docs_per_shard=40",
        "tokenizer.vocab_size=600",
        "shards.workers=2",
        "data.sources=[{name: bbc, format: jsonl, paths: ['s3://corpus/bbc/*.jsonl']}]",
        *extra,
    ]


def test_data_path_from_and_to_s3(s3_server, tmp_path):  # noqa: F811
    fs = s3fs_client(s3_server)
    fs.mkdir("corpus")
    fs.mkdir("runs")
    files = sorted((BBC / "business").glob("*.txt"))[:60]
    for part in range(2):
        rows = [{"text": f.read_text(errors="replace")} for f in files[part::2]]
        rows += rows[:3]  # exact duplicates for dedup to remove
        with fs.open(f"corpus/bbc/part-{part}.jsonl", "w") as out:
            out.write("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "cwd").mkdir()
    # 1. the whole data path through the CLI (preflight probes the bucket), staged in tmp/a
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_pipeline",
            "all",
            "--config",
            str(ROOT / "configs/gpt2-tiny.yaml"),
            *_config(tmp_path, "a"),
        ],
        cwd=tmp_path / "cwd",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert not os.listdir(tmp_path / "cwd")  # no ./s3:/runs/r1
    remote = set(fs.find("runs/r1"))
    for f in (
        "clean/bbc/shard-00000.jsonl.zst",
        "clean/bbc/shard-00000.done",
        "clean/stats.json",
        "dedup/bbc/shard-00000.jsonl.zst",
        "dedup/bbc/shard-00000.done",
        "dedup/_DONE.json",
        "dedup/dedup_stats.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "tokens/manifest.json",
        "tokens/bbc/shard-00000.bin",
        "tokens/bbc/shard-00000.idx.npz",
        "tokens/bbc/shard-00000.json",
    ):
        assert f"runs/r1/{f}" in remote, f
    assert not any(".tmp" in p or p.endswith(".lock") for p in remote)
    cleaned = json.loads(fs.cat("runs/r1/clean/stats.json"))["totals"]["kept"]
    dedup = json.loads(fs.cat("runs/r1/dedup/dedup_stats.json"))
    assert (
        dedup["exact_duplicates"] >= 3
        and dedup["kept"] == cleaned - dedup["exact_duplicates"] - dedup["near_duplicates"]
    )
    manifest = json.loads(fs.cat("runs/r1/tokens/manifest.json"))
    assert manifest["complete"] and manifest["totals"]["docs"] == dedup["kept"]
    n_shards = len(manifest["sources"]["bbc"]["shards"])

    # 2. another node (an empty staging folder): every task is done remotely, nothing is redone
    cfg_b = load_config(ROOT / "configs/gpt2-tiny.yaml", _config(tmp_path, "b"))
    assert run_clean(cfg_b)["shards_run"] == 0
    assert sum(run_dedup(cfg_b)["tasks_run"].values()) == 0
    tok = run_tokenize(cfg_b)  # the tokenizer, the corpus and the finished token shards come from the bucket
    assert tok["shards_written"] == 0 and tok["shards_reused"] == n_shards and tok["complete"]
    assert (tmp_path / "b/tokens/bbc/shard-00000.bin").is_file()
    assert (tmp_path / "b/dedup/bbc/shard-00000.jsonl.zst").is_file()
    assert not list((tmp_path / "b/dedup").glob("_work/*/sig/*"))  # a finished dedup fetches its markers only

    # 3. a task whose marker never reached the bucket (killed during its upload) is redone, although its local
    #    marker says done
    fs.rm("runs/r1/clean/bbc/shard-00001.done")
    cfg_a = load_config(ROOT / "configs/gpt2-tiny.yaml", _config(tmp_path, "a"))
    assert (tmp_path / "a/clean/bbc/shard-00001.done").is_file()
    out = run_clean(cfg_a)
    assert out["shards_run"] == 1 and out["complete"]
    assert fs.exists("runs/r1/clean/bbc/shard-00001.done")


def test_an_unreachable_bucket_stops_before_any_work(s3_server, tmp_path):  # noqa: F811
    from core.preflight import check_output_writable
    from runconfig.load import ConfigError

    cfg = load_config(
        ROOT / "configs/gpt2-tiny.yaml",
        ["run.output_dir=s3://no-such-bucket/r", f"run.local_dir={tmp_path / 'stage'}"],
    )
    with pytest.raises(ConfigError, match=r"run.output_dir: s3://no-such-bucket/r is not writable"):
        check_output_writable(cfg)


def _clean_cli(cfg: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_pipeline", "clean", "--config", str(cfg)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_mistake_in_an_s3_source_is_one_line_and_exit_2(s3_server, tmp_path):  # noqa: F811
    """Issue 43 friction 3: missing credentials, a pattern that matches nothing and a missing bucket were
    tracebacks with exit 1; the same mistakes on a local path are one line naming the key, exit 2."""
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server["AWS_ENDPOINT_URL"]})
    fs.mkdir("corpus")
    with fs.open("corpus/bbc/part-0.jsonl", "w") as out:
        out.write(json.dumps({"text": "One short document."}) + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
    }
    no_creds = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    cases = {
        "nothing": ("s3://corpus/bbc/*.parquet", env, "no files match"),
        "bucket": ("s3://no-such-bucket/bbc/*.jsonl", env, "no-such-bucket"),
        "creds": ("s3://corpus/bbc/*.jsonl", no_creds, "credentials"),
    }
    for case, (pattern, case_env, says) in cases.items():
        cfg = tmp_path / f"{case}.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                    "run": {"output_dir": str(tmp_path / case)},
                    "data": {
                        "sources": [{"name": "web", "format": "jsonl", "paths": [pattern]}],
                        "clean": {"workers": 1, "progress": False},
                    },
                }
            )
        )
        res = _clean_cli(cfg, case_env)
        assert res.returncode == 2, (case, res.returncode, res.stderr[-3000:])
        assert "Traceback" not in res.stderr, (case, res.stderr[-3000:])
        lines = [ln for ln in res.stderr.splitlines() if "data.sources.0.paths.0" in ln]
        assert len(lines) == 1 and pattern in lines[0] and says in lines[0].lower(), (
            case,
            res.stderr[-2000:],
        )
