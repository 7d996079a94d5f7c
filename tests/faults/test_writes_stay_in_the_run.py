"""Issue 25 item 4: no stage writes outside run.output_dir. The data stages (clean, dedup, train-tokenizer,
tokenize) run as the CLI runs them, from a working folder and with a HOME and TMPDIR of their own, all inside one
sandbox; afterwards every file in the sandbox that is not an input must lie under run.output_dir (temporary
files left in TMPDIR count as writes outside the run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data_pipeline.test_bad_input import bbc_texts

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_data_stages_write_only_inside_the_run_folder(tmp_path):
    sandbox = tmp_path / "sandbox"
    inputs, cwd, home, tmp = (sandbox / d for d in ("inputs", "cwd", "home", "tmp"))
    for d in (inputs / "news", cwd, home, tmp):
        d.mkdir(parents=True)
    for i, text in enumerate(bbc_texts(40)):
        (inputs / "news" / f"{i}.txt").write_text(text)
    out = sandbox / "run"
    config = inputs / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/gpt2-tiny.yaml")],
                "run": {"output_dir": str(out)},
                "data": {
                    "sources": [{"name": "bbc", "format": "text_folder", "paths": [str(inputs)]}],
                    "clean": {"workers": 1, "progress": False, "langid": {"enabled": False}},
                },
                "tokenizer": {"vocab_size": 600},
            }
        )
    )
    before = {p for p in sandbox.rglob("*") if p.is_file()}
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "TOKENIZERS_PARALLELISM": "false",
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    for stage in ("clean", "dedup", "train-tokenizer", "tokenize"):
        res = subprocess.run(
            [sys.executable, "-m", "data_pipeline", stage, "--config", str(config)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, f"{stage}: {res.stderr[-2000:]}"
    assert (out / "tokens" / "manifest.json").is_file()
    outside = sorted(
        str(p.relative_to(sandbox))
        for p in sandbox.rglob("*")
        if p.is_file() and p not in before and out not in p.parents
    )
    assert outside == [], f"written outside run.output_dir: {outside[:20]}"
