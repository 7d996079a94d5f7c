"""The tier and timeout rules of tests/conftest.py, run by a real pytest on small test folders: a test outside the
fast tier without its own timeout stops collection naming it, the service markers put a test in the integration
tier (except the smoke run), and the longest timeout is handed out first."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAST = "not integration and not slow"


def _pytest(folder: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    """pytest on one test file under the suite's conftest hooks and its ini (markers, global timeout)."""
    (folder / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (folder / "test_sample.py").write_text("import pytest\n\n" + textwrap.dedent(body))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(folder),
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--collect-only",
            "-q",
            *args,
            str(folder),
        ],
        cwd=folder,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _collected(res: subprocess.CompletedProcess) -> list[str]:
    return [line.split("::")[1] for line in res.stdout.splitlines() if "::" in line]


def test_a_test_outside_the_fast_tier_without_a_timeout_stops_collection(tmp_path):
    res = _pytest(
        tmp_path,
        """
        @pytest.mark.integration
        def test_timed_out_never():
            pass

        @pytest.mark.slow
        @pytest.mark.timeout(60)
        def test_with_timeout():
            pass

        @pytest.mark.deepspeed
        def test_engine_without_timeout():
            pass
    """,
        "-m",
        FAST,
    )
    assert res.returncode != 0
    assert "2 test(s) outside the fast tier have no @pytest.mark.timeout" in res.stderr, res.stderr
    assert "test_timed_out_never" in res.stderr and "test_engine_without_timeout" in res.stderr
    assert "test_with_timeout" not in res.stderr


def test_service_markers_tier_a_test_as_integration_except_the_smoke_run(tmp_path):
    body = """
        pytestmark = pytest.mark.timeout(60)

        def test_unit():
            pass

        @pytest.mark.deepspeed
        def test_engine():
            pass

        @pytest.mark.deepspeed
        @pytest.mark.smoke
        def test_smoke():
            pass

        @pytest.mark.slurm
        def test_cluster():
            pass

        @pytest.mark.slow
        def test_study():
            pass
    """
    fast = _pytest(tmp_path, body, "-m", FAST)
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert sorted(_collected(fast)) == ["test_smoke", "test_unit"]
    integration = _pytest(tmp_path, body, "-m", "integration")
    assert sorted(_collected(integration)) == ["test_cluster", "test_engine"]


def test_longest_timeout_first_then_collection_order(tmp_path):
    res = _pytest(
        tmp_path,
        """
        def test_a():
            pass

        @pytest.mark.integration
        @pytest.mark.timeout(500)
        def test_b():
            pass

        def test_c():
            pass

        @pytest.mark.slow
        @pytest.mark.timeout(2000)
        def test_d():
            pass
    """,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert _collected(res) == ["test_d", "test_b", "test_a", "test_c"]


def test_the_suite_has_a_global_timeout():
    """Every unit test is covered by the ini default; the others carry their own (checked at collection)."""
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < float(ini["timeout"]) <= 600
    assert any(m.startswith("slow:") for m in ini["markers"]) and any(
        m.startswith("smoke:") for m in ini["markers"]
    )


@pytest.mark.parametrize("target", ["test", "test-all"])
def test_make_targets_select_the_tiers(target):
    """`make test` is the fast tier; `make test-all` selects no marker, so it runs every tier."""
    res = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed-test", "-o", ".venv/.installed", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if "-m pytest" in x)
    if target == "test":
        assert f'-m "{FAST}"' in line
    else:
        assert " -m " not in line.split("-m pytest", 1)[1]


def test_a_test_past_its_timeout_fails_and_leaves_no_process_behind(tmp_path):
    """pytest-timeout stops a hung test; the suite's subprocess helper kills the child's whole process group (a
    torchrun and its ranks would otherwise keep the shared cores busy after the test failed)."""
    pid_file = tmp_path / "child.pid"
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_hang.py").write_text(
        textwrap.dedent(f"""
        import pytest
        from tests.pretrain.conftest import run_module

        @pytest.mark.integration
        @pytest.mark.timeout(3)
        def test_hangs():
            run_module(["-c", "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                              "time.sleep(120)"], timeout=600)
    """)
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1 and "Timeout (>3.0s) from pytest-timeout" in res.stdout, res.stdout[-3000:]
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_fast_tier_test_that_starts_torchrun_fails_naming_the_marker(tmp_path):
    """The fast tier keeps its 5 minutes: an unmarked test that launches DeepSpeed ranks fails before launching."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_engine.py").write_text(
        textwrap.dedent("""
        from pathlib import Path
        from tests.pretrain.conftest import torchrun

        def test_unmarked():
            torchrun(Path("no-such-config.yaml"), [])
    """)
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout[-3000:]
    assert (
        "test_unmarked starts torchrun with 2 rank(s) but is in the fast tier: mark it `integration`"
        in res.stdout
    )
