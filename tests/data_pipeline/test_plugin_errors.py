"""Executors are an extension kind with an entry point group (`lmstack.executors`): the config accepts a name an
installed package declares, and a plug-in that fails to load stops the CLI with one line naming it (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runconfig import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def _site(tmp: Path) -> Path:
    """An installed distribution whose executor entry point names a module that does not exist."""
    info = tmp / "site" / "brokenexec-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenexec\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lmstack.executors]\nbroken = brokenexec_missing:Executor\n")
    return tmp / "site"


def _config(tmp: Path, executor: str) -> Path:
    (tmp / "docs").mkdir(exist_ok=True)
    (tmp / "docs" / "a.txt").write_text(
        "The committee met on Tuesday and agreed the budget for the coming year.\n"
    )
    cfg = tmp / "c.yaml"
    cfg.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(tmp / "out")},
                "data": {
                    "executor": executor,
                    "sources": [{"name": "d", "format": "text", "paths": [str(tmp / "docs/*.txt")]}],
                    "clean": {"workers": 1, "progress": False},
                },
            }
        )
    )
    return cfg


def test_unknown_executor_is_a_config_error_naming_the_known_ones(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"data.executor: .*unknown executor 'rayy' \(registered: \['local', "
        r"'ray'\]\); did you mean 'ray'\?",
    ):
        load_config(_config(tmp_path, "rayy"))


def test_a_broken_executor_plugin_stops_the_cli_with_one_line(tmp_path):
    site = _site(tmp_path)
    env = {"PYTHONPATH": f"{ROOT}:{site}", "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [sys.executable, "-m", "data_pipeline", "all", "--config", str(_config(tmp_path, "broken"))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: entry point broken = brokenexec_missing:Executor in group lmstack.executors "
        "failed to load: No module named 'brokenexec_missing'"
    ), res.stderr[-3000:]
