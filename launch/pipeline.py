"""The whole pipeline on one machine, stage by stage: what `make demo` runs.

crawl + corpus -> clean -> dedup -> tokenizer -> token shards -> DeepSpeed pretraining (torchrun, N ranks)
-> checkpoint -> HF export -> reload in a fresh process -> transfer evaluation (pretrained vs random init, HF
Trainer, LR per arm, seeds, probe) -> summary.
Each stage is the same code the stage commands run; this module only sequences them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from core.io import atomic_write, json_bytes
from core.layout import METRICS
from core.log import get_logger
from core.net import free_port
from runconfig import RunConfig, save_resolved
from runconfig.cli import add_config_args, config_from_args

log = get_logger(__name__)

RELOAD_CHECK = """
import json, sys, torch, transformers
from transformers import AutoTokenizer
path, auto_class, task = sys.argv[1], sys.argv[2], sys.argv[3]
tok = AutoTokenizer.from_pretrained(path)
model = getattr(transformers, auto_class).from_pretrained(path).eval()
text = "The company said its profits rose sharply in the third quarter."
if task == "masked_lm":
    text = text.replace("profits", tok.mask_token)
enc = tok(text, return_tensors="pt")
with torch.no_grad():
    if task == "seq2seq":
        out = model(**enc, decoder_input_ids=torch.zeros_like(enc["input_ids"][:, :1]))
    else:
        out = model(**enc)
info = {"class": type(model).__name__, "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
        "logits_shape": list((out.logits if "logits" in out else out.last_hidden_state).shape)}
if task == "masked_lm":
    pos = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[0, 0]
    info["top5_for_mask"] = tok.convert_ids_to_tokens(out.logits[0, pos].topk(5).indices.tolist())
elif task == "causal_lm":  # what the model would say next: a causal LM's own check
    info["top5_next_token"] = [tok.decode([i]) for i in out.logits[0, -1].topk(5).indices.tolist()]
print(json.dumps(info))
"""


def reload_text(info: dict[str, Any]) -> str:
    """The reload check's console line: the class, its size, the logits' shape, and what it predicts (the mask's
    top 5 for a masked LM, the next token's for a causal LM)."""
    line = (
        f"reloaded {info['class']} ({info['params']:,} parameters, vocabulary {info['vocab']:,}); logits "
        f"{'x'.join(map(str, info['logits_shape']))}"
    )
    if info.get("top5_for_mask"):
        line += "; top 5 for the mask: " + ", ".join(info["top5_for_mask"])
    if info.get("top5_next_token"):
        line += "; top 5 next tokens: " + ", ".join(repr(t) for t in info["top5_next_token"])
    return line


def stage_seconds_text(times: dict[str, float]) -> str:
    """'clean 12.3 s, dedup 1.0 s, ...': each stage by the short name before its banner's colon."""
    return ", ".join(f"{name.split(':', 1)[0]} {seconds:.1f} s" for name, seconds in times.items())


# How the fine-tune is scored, by the kind of exported model (printed in the summary).
FINETUNE_SCORING = {
    "classifier": "accuracy of a sequence-classification head (AutoModelForSequenceClassification) on the hold-out",
    "seq2seq": "text-to-text: the generated label word must equal the gold label (exact-match accuracy)",
}


def _banner(msg: str) -> None:
    log.info(f"\n=== {msg} ===")


def run_training(cfg: RunConfig, config_path: Path) -> None:
    """This machine's node command from launch.render (torchrun or the DeepSpeed launcher), on a free port."""
    from launch.render import Entry, node_commands

    local = cfg.model_copy(
        update={"launch": cfg.launch.model_copy(update={"nodes": 1, "master_port": free_port()})}
    )
    cmd = node_commands(local, Entry.train(config_path))[0]
    env = os.environ | cmd.env
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank: the ranks already use every core
    log.info("$ " + cmd.shell())
    rc = subprocess.run(cmd.argv, env=env).returncode
    if rc != 0:
        raise SystemExit(f"training failed with exit code {rc}")


def run_demo(cfg: RunConfig) -> dict[str, Any]:
    from core.run_layout import RunLayout

    layout = RunLayout(cfg)
    t_start = time.time()
    times: dict[str, float] = {}
    resolved = save_resolved(cfg, layout.root)
    if cfg.finetune.tasks:  # a bad fine-tune task (file, column, labels) stops the run before any work
        from data_pipeline.labelled import load_tasks

        load_tasks(cfg)

    def stage(name: str, fn, *a):
        _banner(name)
        t0 = time.time()
        out = fn(*a)
        times[name] = round(time.time() - t0, 1)
        return out

    from data_pipeline.clean import run_clean
    from data_pipeline.dedup import run_dedup
    from data_pipeline.tokenize import run_tokenize
    from data_pipeline.tokenizers import describe as describe_tokenizer
    from data_pipeline.tokenizers import train_tokenizer

    srcs = ", ".join(f"{s.name} ({s.format})" for s in cfg.data.sources)
    dd = cfg.data.dedup
    kinds = " + ".join(
        k for k, on in (("exact", dd.exact), ("MinHash near-duplicates", dd.minhash.enabled)) if on
    )
    clean_stats = stage(f"clean: read, extract and filter {srcs}", run_clean, cfg)
    dedup_stats = stage(f"dedup: {kinds or 'off'}", run_dedup, cfg)
    stage(f"tokenizer: train {describe_tokenizer(cfg)}", train_tokenizer, cfg)
    token_stats = stage("tokenize: write token shards", run_tokenize, cfg)
    budget = f", {cfg.schedule.budget_minutes:g} min budget" if cfg.schedule.budget_minutes else ""
    stage(
        f"pretrain: {cfg.model.family} via DeepSpeed ZeRO-{cfg.deepspeed.zero_stage} on "
        f"{cfg.launch.procs_per_node} ranks{budget}",
        run_training,
        cfg,
        resolved,
    )

    from adapt.transfer import run_transfer
    from pretrain.export.convert import export

    export_dir = stage("export: Hugging Face folder", export, cfg)
    reload_info = _reload_check(cfg, export_dir)
    transfer = (
        stage(
            "transfer: pretrained export vs random init (HF Trainer, LR per arm, seeds, probe)",
            run_transfer,
            cfg,
            export_dir,
            layout.finetune,
        )
        if cfg.finetune.tasks
        else {"tasks": {}}
    )
    state = json.loads((Path(export_dir) / "training_state.json").read_text())
    from pretrain.export.model_card import held_out_perplexity

    # run_transfer rewrote the export's card: its model-index now carries transfer.json's results
    ppl = held_out_perplexity(layout.metrics, state.get("step"))
    summary = {
        **summary_paths(cfg, export_dir),
        "heldout_perplexity": ppl[0] if ppl else None,
        "finetune_scoring": FINETUNE_SCORING[
            "seq2seq" if reload_info.get("class", "").endswith("ForConditionalGeneration") else "classifier"
        ],
        "pretrain_steps": state.get("step"),
        "tokens_seen": state.get("tokens_seen"),
        "final_pretrain_loss": state.get("loss"),
        "eval_loss": _last_eval_loss(layout.logs),
        "transfer": {name: _headline(r) for name, r in transfer["tasks"].items()},
        "reload": reload_info,
        "stats": {"clean": clean_stats, "dedup": dedup_stats, "tokens": token_stats},
        "stage_seconds": times,
        "total_seconds": round(time.time() - t_start, 1),
    }
    atomic_write(layout.summary, json_bytes(summary))
    layout.store.push([layout.finetune, resolved, layout.summary])  # a remote run (run.output_dir URL)
    _print_summary(summary, transfer, times)
    return summary


def _reload_check(cfg: RunConfig, export_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The export loaded by plain transformers in a fresh process, with the Auto class its task needs."""
    _banner("reload the export with plain transformers in a fresh process")
    family = cfg.model.spec
    from pretrain.export.model_card import card_task

    task = card_task(cfg.model.family, cfg.objective.type)
    # an objective that exports another task than the family's (RTD on ModernBERT: the encoder body)
    auto_class = family.auto_class if task == family.task else "AutoModel"
    out = subprocess.run(
        [sys.executable, "-c", RELOAD_CHECK, str(export_dir), auto_class, task],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"reloading the export failed:\n{out.stderr[-3000:]}")
    reload_info = json.loads(out.stdout.strip().splitlines()[-1])
    log.info(reload_text(reload_info))
    return reload_info


# The summary's paths, one a stage wrote, in the order the command prints them.
SUMMARY_PATHS = (
    "run_dir",
    "cleaned_corpus",
    "tokenizer",
    "token_shards",
    "checkpoints",
    "tensorboard",
    "plots",
    "export",
)


def _print_summary(summary: dict[str, Any], transfer: dict[str, Any], times: dict[str, float]) -> None:
    """The command's own output: where each stage wrote, the headline numbers, the transfer table."""
    from adapt.report import format_report, metric_text

    _banner("summary")  # what follows is the command's own output (printed)
    for k in SUMMARY_PATHS:
        print(f"{k:<32} {summary[k]}")
    for k in (
        "pretrain_steps",
        "tokens_seen",
        "final_pretrain_loss",
        "eval_loss",
        "heldout_perplexity",
        "finetune_scoring",
    ):
        print(f"{k:<32} {summary[k]}")
    if transfer["tasks"]:
        metrics = sorted({metric_text(t) for t in transfer["tasks"].values()})
        print(
            f"transfer (test {' / '.join(metrics)}, mean ± sd over seeds; test text never seen in pretraining):"
        )
        print(format_report(transfer))
    print(f"{'stage seconds':<32} {stage_seconds_text(times)}")
    print(f"{'total seconds':<32} {summary['total_seconds']}")


def summary_paths(cfg: RunConfig, export_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The folders summary.json names: where each stage of this run wrote."""
    from core.run_layout import RunLayout
    from data_pipeline.shards import final_stage_dir

    layout = RunLayout(cfg)
    return {
        "run_dir": str(layout.root),
        "cleaned_corpus": str(
            final_stage_dir(cfg)
        ),  # dedup/ once dedup ran, else clean/ (what tokenize read)
        "tokenizer": str(layout.tokenizer),
        "token_shards": str(layout.tokens),
        "checkpoints": str(layout.checkpoints),
        "tensorboard": str(layout.logs),
        "plots": str(layout.plots),
        "export": str(export_dir),
    }


def _headline(r: dict[str, Any]) -> dict[str, Any]:
    """The figures summary.json keeps per task (the full report is transfer.json beside the export)."""
    out: dict[str, Any] = {"test_examples": r["splits"]["test"], "train_examples": r["splits"]["train"]}
    for arm, e in r["arms"].items():
        out[f"{arm}_mean"] = e["test_accuracy"]["mean"]
        out[f"{arm}_sd"] = e["test_accuracy"]["sd"]
        out[f"{arm}_lr"] = e["lr"]
        if "probe_accuracy" in e:
            out[f"{arm}_probe"] = e["probe_accuracy"]
    for k in ("margin", "p_value", "probe_margin"):
        if k in r:
            out[k] = r[k]
    return out


def _last_eval_loss(logs: Path) -> float | None:
    path = logs / METRICS
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if '"eval"' in line]
    rows = [r for r in rows if "loss" in r]  # eval.probe_task's row at step 0 carries the probe alone
    return rows[-1]["loss"] if rows else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m launch pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    args = p.parse_args(argv)
    cfg = config_from_args(args)
    from core.preflight import check_output_writable
    from data_pipeline.readers.sources import check_source_paths
    from runconfig.cli import preflight

    preflight(cfg, check_output_writable, check_source_paths)  # before the first of many stages
    run_demo(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
