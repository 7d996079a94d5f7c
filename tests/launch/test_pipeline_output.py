"""Issue 66, the demo's own output: the reload line printed `top5_for_mask: null` for a model with no mask (a
causal LM names its top next tokens instead, read in a fresh process), `stage seconds` was a Python dict, and the
transfer header called every figure "test accuracy"."""

from __future__ import annotations

from launch.pipeline import SUMMARY_PATHS, _print_summary, _reload_check, reload_text
from runconfig import load_config
from tests.hf_folder import gpt2_folder

SUMMARY = {k: f"/runs/demo/{k}" for k in SUMMARY_PATHS}
SUMMARY |= {
    "pretrain_steps": 10,
    "tokens_seen": 100,
    "final_pretrain_loss": 6.0,
    "eval_loss": 6.1,
    "heldout_perplexity": 440.0,
    "finetune_scoring": "accuracy",
    "total_seconds": 99.0,
}


def test_the_reload_line_of_a_causal_lm_has_no_null_mask_and_reads_as_words(tmp_path, capsys):
    export = gpt2_folder(tmp_path / "export")
    cfg = load_config("configs/demo.yaml", [f"run.output_dir={tmp_path}/run"])
    assert cfg.model.spec.task == "causal_lm"
    info = _reload_check(cfg, export)
    assert "top5_for_mask" not in info and len(info["top5_next_token"]) == 5, info
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("reloaded ")]
    assert "null" not in line and "GPT2LMHeadModel" in line and "top 5 next tokens" in line, line
    assert reload_text(
        {
            "class": "RobertaForMaskedLM",
            "params": 10,
            "vocab": 5,
            "logits_shape": [1, 3, 5],
            "top5_for_mask": ["a", "b"],
        }
    ).endswith("top 5 for the mask: a, b")


def test_stage_seconds_read_as_a_list_and_the_header_names_each_tasks_metric(capsys):
    times = {
        "clean: read, extract and filter crawl (warc)": 12.34,
        "dedup: exact": 1.0,
        "pretrain: gpt2 via": 60.0,
    }
    task = {
        "splits": {"train": 10, "dev": 5, "test": 5},
        "labels": [],
        "origin": "files",
        "metric": "pearsonr",
        "arms": {"pretrained": {"lr": 1e-4, "test_accuracy": {"mean": 0.5, "sd": 0.0, "values": [0.5]}}},
    }
    _print_summary(SUMMARY, {"tasks": {"sts": task}}, times)
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("stage seconds")]
    assert "{" not in line and "clean 12.3 s, dedup 1.0 s, pretrain 60.0 s" in line, line
    (header,) = [x for x in out.splitlines() if x.startswith("transfer (")]
    assert "test accuracy" not in header and "Pearson r" in header, header
