"""launch.side_venv: a cached side venv is built once even when several processes ask for it at the same moment
(CI built the transformers-4.40 venv from two pytest-xdist workers at once and pip failed on the other's files)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from launch.side_venv import ensure_venv

# integration: each test builds real venvs (python -m venv, pip) in subprocesses, 15-30 s apiece.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]

CALL = """
import json, sys
from pathlib import Path
from launch.side_venv import ensure_venv
print(json.dumps(str(ensure_venv(Path(sys.argv[1]), [], probe="import json"))))
"""


def test_concurrent_callers_build_once(tmp_path):
    venv = tmp_path / "side"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CALL, str(venv)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    pythons = {json.loads(o[0].strip().splitlines()[-1]) for o in outs}
    assert pythons == {str(venv / "bin" / "python")}
    assert (venv / "builds.log").read_text().count("built") == 1  # one build, the others waited and reused it


def test_stale_or_changed_requirements_rebuild(tmp_path):
    venv = tmp_path / "side"
    python = ensure_venv(venv, [], probe="import json")
    assert subprocess.run([str(python), "-c", "import json"]).returncode == 0
    assert ensure_venv(venv, [], probe="import json") == python
    assert (venv / "builds.log").read_text().count("built") == 1
    with pytest.raises(RuntimeError, match="import this_module_does_not_exist_anywhere"):
        ensure_venv(venv, [], probe="import this_module_does_not_exist_anywhere")
    assert (venv / "builds.log").read_text().count(
        "built"
    ) == 2  # a failing probe rebuilds, then names itself


def test_layered_venv_sees_the_base_packages_after_its_own(tmp_path):
    plain = ensure_venv(tmp_path / "plain", [])
    assert subprocess.run([str(plain), "-c", "import yaml"], capture_output=True).returncode != 0
    python = ensure_venv(tmp_path / "layered", [], probe="import yaml, pydantic", layered=True)
    paths = json.loads(
        subprocess.run(
            [str(python), "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    own = next(i for i, p in enumerate(paths) if p.startswith(str(tmp_path / "layered")))
    base = paths.index(sysconfig.get_paths()["purelib"])
    assert own < base  # what the venv installs itself shadows the base's version
