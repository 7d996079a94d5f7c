"""The whole pipeline on one machine, stage by stage: what `make demo` runs.

crawl + corpus -> clean -> dedup -> tokenizer -> token shards -> DeepSpeed pretraining (torchrun, N ranks)
-> checkpoint -> HF export -> reload in a fresh process -> fine-tune (pretrained vs random init) -> summary.
Each stage is the same code the stage commands run; this module only sequences them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runconfig import RunConfig, save_resolved
from runconfig.cli import add_config_args, config_from_args

RELOAD_CHECK = """
import json, sys, torch
from transformers import AutoModelForMaskedLM, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
path, family = sys.argv[1], sys.argv[2]
cls = {"roberta": AutoModelForMaskedLM, "gpt2": AutoModelForCausalLM, "t5": AutoModelForSeq2SeqLM}[family]
tok = AutoTokenizer.from_pretrained(path)
model = cls.from_pretrained(path).eval()
text = "The company said its profits rose sharply in the third quarter."
if family == "roberta":
    text = text.replace("profits", tok.mask_token)
enc = tok(text, return_tensors="pt")
with torch.no_grad():
    if family == "t5":
        out = model(**enc, decoder_input_ids=torch.zeros_like(enc["input_ids"][:, :1]))
    else:
        out = model(**enc)
top = None
if family == "roberta":
    pos = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[0, 0]
    top = tok.convert_ids_to_tokens(out.logits[0, pos].topk(5).indices.tolist())
print(json.dumps({"class": type(model).__name__, "params": sum(p.numel() for p in model.parameters()),
                  "vocab": len(tok), "logits_shape": list(out.logits.shape), "top5_for_mask": top}))
"""


# How the fine-tune is scored, by the kind of exported model (printed in the summary).
FINETUNE_SCORING = {
    "classifier": "accuracy of a sequence-classification head (AutoModelForSequenceClassification) on the hold-out",
    "seq2seq": "text-to-text: the generated label word must equal the gold label (exact-match accuracy)",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _banner(msg: str) -> None:
    print(f"\n=== {msg} ===", flush=True)


def run_training(cfg: RunConfig, config_path: Path) -> None:
    """This machine's node command from launch.render (torchrun or the DeepSpeed launcher), on a free port."""
    from launch.render import Entry, node_commands

    local = cfg.model_copy(update={"launch": cfg.launch.model_copy(update={"nodes": 1, "master_port": _free_port()})})
    cmd = node_commands(local, Entry.train(config_path))[0]
    env = os.environ | cmd.env
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank: the ranks already use every core
    print("$ " + cmd.shell(), flush=True)
    rc = subprocess.run(cmd.argv, env=env).returncode
    if rc != 0:
        raise SystemExit(f"training failed with exit code {rc}")


def run_demo(cfg: RunConfig) -> dict[str, Any]:
    from data_pipeline.layout import RunLayout

    layout = RunLayout(cfg)
    t_start = time.time()
    times: dict[str, float] = {}
    resolved = save_resolved(cfg, layout.root)

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
    kinds = " + ".join(k for k, on in (("exact", dd.exact), ("MinHash near-duplicates", dd.minhash.enabled)) if on)
    clean_stats = stage(f"clean: read, extract and filter {srcs}", run_clean, cfg)
    dedup_stats = stage(f"dedup: {kinds or 'off'}", run_dedup, cfg)
    stage(f"tokenizer: train {describe_tokenizer(cfg)}", train_tokenizer, cfg)
    token_stats = stage("tokenize: write token shards", run_tokenize, cfg)
    stage(f"pretrain: {cfg.model.family} via DeepSpeed ZeRO-{cfg.deepspeed.zero_stage} on "
          f"{cfg.launch.procs_per_node} ranks", run_training, cfg, resolved)

    from pretrain.export import export
    from pretrain.finetune import finetune

    export_dir = stage("export: Hugging Face folder", export, cfg)
    _banner("reload the export with plain transformers in a fresh process")
    out = subprocess.run([sys.executable, "-c", RELOAD_CHECK, str(export_dir), cfg.model.family],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"reloading the export failed:\n{out.stderr[-3000:]}")
    reload_info = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(reload_info))
    ft_pre = stage("finetune: classifier from the pretrained export", finetune, cfg, export_dir, "pretrained",
                   layout.finetune)
    ft_rand = stage("finetune: same classifier from random initialisation", finetune, cfg, export_dir, "random",
                    layout.finetune)
    state = json.loads((Path(export_dir) / "training_state.json").read_text())
    from pretrain.model_card import held_out_perplexity

    ppl = held_out_perplexity(layout.logs / "metrics.jsonl", state.get("step"))
    summary = {
        "run_dir": str(layout.root),
        "cleaned_corpus": str(layout.dedup),
        "tokenizer": str(layout.tokenizer),
        "token_shards": str(layout.tokens),
        "checkpoints": str(layout.checkpoints),
        "tensorboard": str(layout.logs),
        "plots": str(layout.logs / "plots"),
        "export": str(export_dir),
        "heldout_perplexity": ppl[0] if ppl else None,
        "finetune_scoring": FINETUNE_SCORING["seq2seq" if reload_info.get("class", "").endswith(
            "ForConditionalGeneration") else "classifier"],
        "pretrain_steps": state.get("step"),
        "tokens_seen": state.get("tokens_seen"),
        "final_pretrain_loss": state.get("loss"),
        "finetune_accuracy_pretrained": ft_pre["accuracy"],
        "finetune_accuracy_random_init": ft_rand["accuracy"],
        "finetune_train_examples": ft_pre["train_examples"],
        "finetune_test_examples": ft_pre["test_examples"],
        "reload": reload_info,
        "stats": {"clean": clean_stats, "dedup": dedup_stats, "tokens": token_stats},
        "stage_seconds": times,
        "total_seconds": round(time.time() - t_start, 1),
    }
    (layout.root / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    _banner("summary")
    for k in ("run_dir", "cleaned_corpus", "tokenizer", "token_shards", "checkpoints", "tensorboard", "plots",
              "export"):
        print(f"{k:<32} {summary[k]}")
    for k in ("pretrain_steps", "tokens_seen", "final_pretrain_loss", "heldout_perplexity", "finetune_scoring"):
        print(f"{k:<32} {summary[k]}")
    print(f"{'fine-tune accuracy (pretrained)':<32} {ft_pre['accuracy']:.3f}   "
          f"({ft_pre['test_examples']} held-out BBC articles never seen in pretraining)")
    print(f"{'fine-tune accuracy (random init)':<32} {ft_rand['accuracy']:.3f}")
    print(f"{'stage seconds':<32} {times}")
    print(f"{'total seconds':<32} {summary['total_seconds']}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p)
    args = p.parse_args(argv)
    run_demo(config_from_args(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
