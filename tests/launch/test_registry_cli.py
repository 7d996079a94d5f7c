"""`python -m launch registry` lists what every registry holds: the built-ins of all six kinds, and what an
outside package adds through entry points."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.pretrain.conftest import ROOT
from tests.pretrain.test_family_plugins import install_toy_plugin, plugin_env


def test_registry_lists_builtins_and_entry_points(tmp_path):
    plug = install_toy_plugin(tmp_path / "site")
    res = subprocess.run(
        [sys.executable, "-m", "launch", "registry", "--json"],
        cwd=ROOT,
        env=plugin_env(plug),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    reg = json.loads(res.stdout)
    assert set(reg) == {
        "families",
        "objectives",
        "filters",
        "readers",
        "executors",
        "tokenizer_conventions",
        "adapt_methods",
        "callbacks",
    }
    entries = {name: r["entries"] for name, r in reg.items()}
    assert {"roberta", "gpt2", "t5", "modernbert", "electra"} <= set(entries["families"])
    # the implementation, not only the spec
    assert entries["families"]["roberta"] == "pretrain.families.roberta"
    assert entries["families"]["toybert"] == "toyplug" and entries["objectives"]["toy_mlm"].startswith(
        "data_pipeline"
    )
    assert {"mlm", "causal", "span_corruption", "electra"} <= set(entries["objectives"])
    assert set(entries["filters"]) >= {"unicode", "langid", "gopher_repetition", "gopher_quality", "c4"}
    assert {"warc", "jsonl", "csv", "parquet", "text", "hf_dataset"} <= set(entries["readers"])
    assert set(entries["executors"]) >= {"local", "ray"}
    assert set(entries["tokenizer_conventions"]) >= {"roberta", "gpt2", "bert", "t5"}
    assert reg["executors"]["entry_point_group"] == "lmstack.executors"

    text = subprocess.run(
        [sys.executable, "-m", "launch", "registry"],
        cwd=ROOT,
        env=plugin_env(plug),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        text.returncode == 0
        and "  toybert" in text.stdout
        and text.stdout.startswith("families (model.family")
    )
