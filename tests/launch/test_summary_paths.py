"""summary.json names the folders the stages wrote, checkpoint.dir included (it named <run>/checkpoints, a folder
training never wrote, when checkpoint.dir was set)."""

from __future__ import annotations

from pathlib import Path

from launch.pipeline import summary_paths
from pretrain.run.plots import plot_run
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(ROOT / "configs" / "demo.yaml", [f"run.output_dir={tmp_path / 'run'}", *overrides])


def test_summary_points_at_checkpoint_dir_when_set(tmp_path):
    ckpts = tmp_path / "elsewhere" / "ckpts"
    cfg = _cfg(tmp_path, f"checkpoint.dir={ckpts}")
    paths = summary_paths(cfg, tmp_path / "run" / "export")
    # pretrain/run/train.py saves every checkpoint under cfg.checkpoint_dir
    assert paths["checkpoints"] == str(ckpts) == cfg.checkpoint_dir
    assert paths["run_dir"] == str(tmp_path / "run")


def test_summary_default_folders_are_the_ones_the_stages_write(tmp_path):
    cfg = _cfg(tmp_path)
    paths = summary_paths(cfg, tmp_path / "run" / "export")
    run = tmp_path / "run"
    assert paths["checkpoints"] == str(run / "checkpoints") == cfg.checkpoint_dir
    # The trainer's plots: write them from a metrics file where the trainer logs, and compare the folder.
    logs = Path(paths["tensorboard"])
    logs.mkdir(parents=True)
    (logs / "metrics.jsonl").write_text(
        '{"split": "train", "step": 1, "loss": 5.0, "lr": 0.001, "time": 0}\n'
        '{"split": "train", "step": 2, "loss": 4.0, "lr": 0.001, "time": 1}\n'
    )
    pngs = plot_run(cfg.run.root)
    assert pngs and {str(p.parent) for p in pngs} == {paths["plots"]}


def test_cleaned_corpus_is_the_folder_the_tokenizer_reads_with_dedup_off_or_on(tmp_path):
    """With dedup off the final corpus is clean/ (summary.json named dedup/, a folder no stage wrote)."""
    from data_pipeline.shards import DEDUP_DONE, final_stage_dir

    run = tmp_path / "run"
    off = _cfg(tmp_path, "data.dedup.exact=false", "data.dedup.minhash.enabled=false")
    assert (
        summary_paths(off, run / "export")["cleaned_corpus"]
        == str(final_stage_dir(off))
        == str(run / "clean")
    )
    on = _cfg(tmp_path, "data.dedup.exact=true")
    (run / "dedup").mkdir(parents=True)
    (run / "dedup" / DEDUP_DONE).write_text("{}")  # the marker the dedup stage writes last
    assert (
        summary_paths(on, run / "export")["cleaned_corpus"] == str(final_stage_dir(on)) == str(run / "dedup")
    )
