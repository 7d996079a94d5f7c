"""The README's "single GPU box" commands run as written: the presets behind them are one-node presets, so
`launch run --config <preset> launch.procs_per_node=8 ...` renders one torchrun (or DeepSpeed launcher) command
on this box instead of exiting 2 for a missing hostfile / master address."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.__main__ import main
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]

# The commands as the README's "A single GPU box" section gives them (plus --dry-run and a scratch run folder).
ONE_BOX = [
    ["run", "--config", "configs/gpt2-small.yaml", "launch.procs_per_node=8", "launch.backend=nccl"],
    ["run", "--config", "configs/gpt2-small.yaml", "launch.launcher=deepspeed", "launch.procs_per_node=8"],
]


@pytest.mark.parametrize("argv", ONE_BOX, ids=["torchrun", "deepspeed"])
def test_single_box_commands_render(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(ROOT)
    assert main([*argv, f"run.output_dir={tmp_path}/run", "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "nodes=1 procs_per_node=8 world_size=8" in out
    assert ("--nproc_per_node 8" in out) if "deepspeed" not in argv[3] else ("--num_gpus 8" in out)


def test_one_box_presets_are_one_node():
    cfg = load_config(ROOT / "configs" / "gpt2-small.yaml")
    assert cfg.launch.nodes == 1 and cfg.launch.procs_per_node == 8
    assert cfg.batch_plan(8)["global_batch_size"] == 512  # the recipe's batch, by gradient accumulation


def test_clean_workers_override_is_spelled_with_its_section():
    cfg = load_config(
        ROOT / "configs" / "demo.yaml", ["data.clean.workers=4", "data.sources.1.holdout_fraction=0.2"]
    )
    assert cfg.data.clean.workers == 4
    with pytest.raises(Exception, match="clean"):
        load_config(ROOT / "configs" / "demo.yaml", ["clean.workers=4"])
