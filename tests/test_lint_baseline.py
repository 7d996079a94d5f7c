"""The mypy baseline of `make lint` (.ci/mypy_baseline.py): errors are counted per file from a real mypy run, a
file over its baseline count fails, one under it passes and is reported, and the committed baseline parses and
names only files that exist."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("mypy_baseline", ROOT / ".ci" / "mypy_baseline.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(120)
def test_counts_real_mypy_errors_per_file_and_fails_only_on_growth(tmp_path):
    mb = _script()
    (tmp_path / "two.py").write_text('x: int = "a"\ny: str = 1\n')
    (tmp_path / "clean.py").write_text("z: int = 1\n")
    (tmp_path / "note.py").write_text("def f(a):\n    return a\nreveal_type(f)\n")  # a note, not an error
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--config-file",
            "/dev/null",
            "two.py",
            "clean.py",
            "note.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    ).stdout
    found = mb.count_errors(out)
    assert found == Counter({"two.py": 2})

    worse, better = mb.compare(found, Counter({"two.py": 1}))
    assert [w.split(":")[0] for w in worse] == ["two.py"] and better == []
    worse, better = mb.compare(found, Counter({"two.py": 3, "gone.py": 1}))
    assert worse == [] and [b.split(":")[0] for b in better] == ["gone.py", "two.py"]

    path = tmp_path / "baseline.txt"
    mb.write_baseline(path, found)
    assert mb.read_baseline(path) == found


def test_committed_baseline_names_existing_files():
    mb = _script()
    baseline = mb.read_baseline(mb.BASELINE)
    missing = [f for f in baseline if not (ROOT / f).is_file()]
    assert not missing, f".ci/mypy-baseline.txt names files that are gone (run it with --update): {missing}"
