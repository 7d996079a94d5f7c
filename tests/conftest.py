"""Suite-wide: `make test` runs on 2 pytest-xdist workers (`--dist loadgroup`). Tests that start machine-wide
services (the local Slurm cluster, network namespaces with fixed names, a Ray head) share one group, so one worker
runs them one after another while the other worker runs the rest."""

from __future__ import annotations

import pytest

SERIAL_MARKERS = ("slurm", "netns", "ray")


def pytest_itemcollected(item):
    """Per item at collection, before any `pytest_collection_modifyitems` (xdist's reads the group there)."""
    if any(item.get_closest_marker(m) for m in SERIAL_MARKERS):
        item.add_marker(pytest.mark.xdist_group("machine-services"))
