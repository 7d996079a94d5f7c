"""Suite-wide: the test tiers, the per-test timeouts and the order tests are handed out in.

Tiers, by marker (`make test` runs the fast tier, `make test-all` every tier):
- fast (no tier marker): unit tests, plus the one `smoke` DeepSpeed run; at most 5 minutes for the whole tier.
- `integration`: real processes: the DeepSpeed engine, Slurm, network namespaces, Ray, side venvs, long
  subprocess pipelines. A test marked `deepspeed`, `slurm`, `netns`, `ray` or `compat` is integration by that
  marker alone (added here at collection), unless it is marked `smoke`.
- `slow`: the long studies (the 20-kill chaos test, side venvs with other transformers or mlflow from PyPI).

Timeouts (pytest-timeout): `timeout` in pyproject.toml covers every test; a test outside the fast tier (marked
`integration`, `slow`, `smoke`, or one of the service markers) must carry its own `@pytest.mark.timeout(s)`, or
collection fails naming it. That number is also the scheduling hint: tests are handed out longest-timeout first
(longest-processing-time-first on the 2 xdist workers; collected in path order, the 17-minute chaos test started
late and left one core busy alone for the last ~10 minutes of the run). Give a long test a timeout of about 2.5x
what it takes under `make test-all` (at least 420 s for integration: fixtures built on first use count too).

Tests that start machine-wide services (the local Slurm cluster, network namespaces with fixed names, a Ray head)
share one xdist group, so one worker runs them one after another while the other worker runs the rest.
"""

from __future__ import annotations

import os
import sys

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch (OpenMP) and one tokenizers (rayon) thread per xdist worker: 2 workers on 2 cores already use
    # every core, and more threads only spin against each other (the ELECTRA objective tests: 65 s alone with 2
    # threads under load, 13 s with 1; tokenizer training 38 s -> 25 s). Set before any test module imports torch
    # or tokenizers; subprocess ranks get OMP_NUM_THREADS=1 from their helpers too.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

SERIAL_MARKERS = ("slurm", "netns", "ray")
# Markers that make a test integration by themselves (a real engine, cluster or side venv), unless `smoke`.
INTEGRATION_MARKERS = ("deepspeed", "slurm", "netns", "ray", "compat")
# A test carrying any of these needs its own timeout marker: the global default is sized for unit tests.
NEEDS_OWN_TIMEOUT = ("integration", "slow", "smoke", *INTEGRATION_MARKERS)


def pytest_configure(config):
    """No test runs without a timeout: refuse to run when pytest-timeout is missing or switched off."""
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError(
            "pytest-timeout is not installed: every test needs a timeout (pip install -e '.[test]')"
        )
    if float(config.getini("timeout") or 0) <= 0 and not config.getoption("timeout", None):
        raise pytest.UsageError("no global test timeout: set `timeout` in [tool.pytest.ini_options]")


def explicit_timeout(item: pytest.Item) -> float | None:
    """The item's own `@pytest.mark.timeout(s)` (function, class or module), or None."""
    mark = item.get_closest_marker("timeout")
    if mark is None:
        return None
    value = mark.args[0] if mark.args else mark.kwargs.get("timeout")
    return float(value) if value is not None else None


def pytest_itemcollected(item):
    """Per item at collection, before any `pytest_collection_modifyitems` (xdist's reads the group there, `-m`
    deselects there)."""
    if any(item.get_closest_marker(m) for m in SERIAL_MARKERS):
        item.add_marker(pytest.mark.xdist_group("machine-services"))
    if (
        not item.get_closest_marker("smoke")
        and not item.get_closest_marker("integration")
        and any(item.get_closest_marker(m) for m in INTEGRATION_MARKERS)
    ):
        item.add_marker(pytest.mark.integration)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test outside the fast tier has its own timeout; then longest timeout first (the sort is stable, so
    everything else keeps pytest's order)."""
    missing = [
        item.nodeid
        for item in items
        if any(item.get_closest_marker(m) for m in NEEDS_OWN_TIMEOUT) and not explicit_timeout(item)
    ]
    if missing:
        raise pytest.UsageError(
            f"{len(missing)} test(s) outside the fast tier have no @pytest.mark.timeout(seconds) (tests/conftest.py "
            f"says how to size it): " + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
        )
    items.sort(key=lambda item: -(explicit_timeout(item) or 0.0))


_RUNNING: list[pytest.Item] = []  # the test being set up, run or torn down in this process


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _RUNNING[:] = [item]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    _RUNNING.clear()


def require_outside_fast_tier(what: str) -> None:
    """Helpers that start the DeepSpeed engine call this: a fast-tier test (no `integration`, `slow` or `smoke`
    marker) that does so fails at once, naming the markers it needs, instead of slowing `make test` unnoticed."""
    item = _RUNNING[0] if _RUNNING else None
    if item is not None and not any(item.get_closest_marker(m) for m in ("integration", "slow", "smoke")):
        pytest.fail(
            f"{item.nodeid} starts {what} but is in the fast tier: mark it `integration` (or "
            "`deepspeed`) with its own @pytest.mark.timeout(seconds); see tests/conftest.py",
            pytrace=False,
        )
