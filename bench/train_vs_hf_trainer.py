"""Training throughput: our trainer vs the Hugging Face `Trainer`, same model, data, batch and DeepSpeed config.

Setup (prepared here, nothing downloaded): the BBC News corpus goes through our data stages (clean -> dedup ->
train-tokenizer (byte-level BPE 8000) -> tokenize, FULL-SENTENCES packing at seq_len 128) into a temporary run.
Model: RoBERTa MLM, hidden 256, 4 layers, 4 heads, FFN 1024, built by `pretrain.models.build_model` on both sides.
Both sides run on 2 CPU ranks under torchrun (gloo, 1 thread per rank), micro-batch 8, global batch 16, fp32,
DeepSpeed ZeRO-2 with the ds_config dict our `build_ds_config` generates (the HF side receives that same dict via
`TrainingArguments(deepspeed=dict)`), torch AdamW with the same hyper-parameters and linear warmup/decay, one
DataLoader worker per rank. The HF side trains on the very same packed samples (a torch Dataset over our packed
blocks) collated by `DataCollatorForLanguageModeling`, so the engine is what differs.

What is timed: steady state only, steps WARMUP+1 .. WARMUP+MEASURE (the first WARMUP steps, start-up, the final
eval and checkpoint are outside the window). Ours: the rows of its own metrics.jsonl (logged every WARMUP steps);
HF: `on_step_end` timestamps on rank 0. Tokens are attention-mask sums (non-pad) on both sides. The two sides run
alternately (A B A B ...) to spread the noise of this shared 2-core machine over both, and medians are reported.

MFU: our tokens/s x training FLOPs per token (`pretrain.metrics.flops_per_token`: 6N + attention) / (world size x
per-rank peak), the peak being our own fp32 1024^3 matmul probe with one thread (best of 5), also handed to the
trainer (`logging.peak_flops`) so its logged MFU uses the same denominator.

`python bench/train_vs_hf_trainer.py [--rounds 2]`  (about 5-6 minutes here)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

WARMUP, MEASURE = 3, 12
MODEL = ["model.hidden_size=256", "model.num_layers=4", "model.num_heads=4", "model.ffn_size=1024"]
EXTRA_YAML = "tokenizer: {vocab_size: 8000}\npacking: {seq_len: 128}\n"


def overrides(peak: float) -> list[str]:
    total = WARMUP + MEASURE
    return [*MODEL, "batch.micro_batch_size=8", "batch.global_batch_size=16", f"schedule.total_steps={total}",
            f"schedule.warmup_steps={WARMUP}", f"eval.every_steps={total}", "eval.max_batches=1",
            f"checkpoint.every_steps={total}", f"logging.peak_flops={peak:.6g}"]  # fmt: skip


def model_flops_per_token(cfg_path: Path, ov: list[str]) -> tuple[float, int]:
    from transformers import AutoTokenizer

    from data_pipeline.layout import RunLayout
    from pretrain.metrics import flops_per_token
    from pretrain.models import build_model, count_parameters
    from runconfig import load_config

    cfg = load_config(cfg_path, ov)
    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    n = count_parameters(build_model(cfg.model, tok, cfg.packing.seq_len))
    return flops_per_token(cfg.model, n, cfg.packing.seq_len), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds (each: our run, then the HF run)")
    a = ap.parse_args()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        cfg_path = C.prepare_run(tmp / "data", "roberta", EXTRA_YAML)
        print(f"data stages on BBC: {time.perf_counter() - t0:.0f}s")
        peak = C.cpu_peak_flops(threads=1)
        ov = overrides(peak)
        fpt, n_params = model_flops_per_token(cfg_path, ov)
        print(f"model: RoBERTa {n_params / 1e6:.2f}M params, {fpt / 1e6:.1f} MFLOP/token (training); "
              f"per-rank fp32 matmul peak {peak / 1e9:.1f} GFLOP/s (1 thread)")  # fmt: skip
        ours, hf = [], []
        for r in range(a.rounds):
            o = C.run_ours(cfg_path, tmp / "work", ov, WARMUP)
            ours.append(o)
            print(f"round {r + 1} ours: {o['tokens_per_s']:.0f} tokens/s over {o['tokens']} tokens "
                  f"(loader wait {o['loader_wait_frac']:.1%}, logged MFU {o['mfu_logged']:.1%}, wall {o['wall_s']:.0f}s)")  # fmt: skip
            h = C.run_hf(cfg_path, tmp / "work", ov, WARMUP, "packed")
            hf.append(h)
            print(f"round {r + 1} HF Trainer: {h['tokens_per_s']:.0f} tokens/s over {h['tokens']:.0f} tokens "
                  f"({h['engine']}, {h['distributed_type']}, world {h['world_size']}, wall {h['wall_s']:.0f}s)")  # fmt: skip
        print(f"ds_config (both sides): {hf[-1]['ds_config']}")
    o_tps = C.median([x["tokens_per_s"] for x in ours])
    h_tps = C.median([x["tokens_per_s"] for x in hf])
    world = 2
    mfu = o_tps * fpt / (world * peak)
    h_mfu = h_tps * fpt / (world * peak)
    ratio = o_tps / h_tps
    print(f"steady state ({MEASURE} steps after {WARMUP}), medians of {a.rounds}: ours {o_tps:.0f} tokens/s, "
          f"HF Trainer {h_tps:.0f} tokens/s; MFU ours {mfu:.1%}, HF {h_mfu:.1%} of {peak / 1e9:.1f} GFLOP/s per rank")  # fmt: skip
    print(f"total bench time {time.perf_counter() - t_start:.0f}s")
    print(f"VERDICT train_tokens_per_s_vs_hf_trainer: ours={o_tps:.0f} peer={h_tps:.0f} ratio={ratio:.2f} goal=1.1 "
          f"{'pass' if ratio >= 1.1 else 'fail'}")  # fmt: skip
    # MFU has no peer: peer= carries the denominator (measured per-rank fp32 peak, GFLOP/s), ratio= the MFU itself.
    print(f"VERDICT train_mfu_cpu: ours={mfu:.3f} peer={peak / 1e9:.1f} ratio={mfu:.3f} goal=report pass")


if __name__ == "__main__":
    main()
