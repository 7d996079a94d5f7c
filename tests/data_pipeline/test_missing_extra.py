"""An optional extra that is missing (http, s3, gcs) is one line naming the extra to install, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
for mod in sys.argv[1].split(","):
    sys.modules[mod] = None  # as if the extra were not installed
from data_pipeline.__main__ import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    "url,missing,extra",
    [
        ("http://example.invalid/crawl/x.warc.gz", "aiohttp", "http"),
        ("s3://bucket/crawl/*.warc.gz", "s3fs", "s3"),
        ("gs://bucket/crawl/*.warc.gz", "gcsfs", "gcs"),
    ],
)
def test_missing_backend_is_one_line_naming_the_extra(tmp_path, url, missing, extra):
    argv = [
        "clean",
        "--config",
        "configs/demo.yaml",
        f"run.output_dir={tmp_path}/run",
        f"data.sources.0.paths=[{url}]",
    ]
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, missing, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    assert "data.sources.0.paths.0" in lines[0] and f"pip install 'lmstack[{extra}]'" in lines[0], lines[0]
