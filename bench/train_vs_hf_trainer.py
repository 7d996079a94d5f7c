"""Training throughput: our trainer vs the Hugging Face `Trainer`, same model, data, batch and DeepSpeed config.

Setup (prepared here, nothing downloaded): the BBC News corpus goes through our data stages (clean -> dedup ->
train-tokenizer (byte-level BPE 8000) -> tokenize, FULL-SENTENCES packing at seq_len 128) into a temporary run.
Model: RoBERTa MLM, hidden 256, 4 layers, 4 heads, FFN 1024, built by `pretrain.run.models.build_model` on both sides.
Both sides run on 2 CPU ranks under torchrun (gloo, 1 thread per rank), micro-batch 8, global batch 16, fp32,
DeepSpeed ZeRO-2 with the ds_config dict our `build_ds_config` generates (the HF side receives that same dict via
`TrainingArguments(deepspeed=dict)`), torch AdamW with the same hyper-parameters and linear warmup/decay, one
DataLoader worker per rank. The HF side trains on the very same packed samples (a torch Dataset over our packed
blocks) collated by `DataCollatorForLanguageModeling`, so the engine is what differs.
Ours runs with its defaults, which include MLM sparse prediction (`objective.sparse_prediction`: the head only on
masked positions; the same loss and gradients as the dense head the HF model computes for every position). To see
the dense-head figure, pass `--set objective.sparse_prediction=false`.

What is timed: steady state only, steps WARMUP+1 .. WARMUP+MEASURE (the first WARMUP steps, start-up, the final
eval and checkpoint are outside the window). Ours: the rows of its own metrics.jsonl (logged every WARMUP steps);
HF: `on_step_end` timestamps on rank 0. Tokens are counted the same way on both sides: the attention-mask sums
(non-pad tokens) of every micro-batch trained on, summed over ranks (ours recomputed from the loader's
deterministic order, `_common.consumed_tokens`). The two sides run alternately (ours, HF, ours, ...) for
`--rounds` rounds (default 5); VERDICTs are medians of the per-round ratios (bench/_common.Report).

MFU: tokens/s x training FLOPs per token (`pretrain.run.metrics.flops_per_token`: 6N + attention) / (world size x
per-rank peak) for both sides with the same peak, our own fp32 1024^3 matmul probe with one thread (best of 5),
also handed to the trainer (`logging.peak_flops`) so its logged MFU uses the same denominator.

`--grad-accum 8` runs the same comparison at 8 micro-batches per step (global batch 128) and prints the step time.

`python bench/train_vs_hf_trainer.py [--rounds 5] [--grad-accum 1]`  (about 10 minutes here)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

WARMUP, MEASURE = 3, 12
MODEL = ["model.hidden_size=256", "model.num_layers=4", "model.num_heads=4", "model.ffn_size=1024"]
EXTRA_YAML = "tokenizer: {vocab_size: 8000}\npacking: {seq_len: 128}\n"


def overrides(peak: float, grad_accum: int, measure: int = MEASURE) -> list[str]:
    total = WARMUP + measure
    return [
        *MODEL,
        "batch.micro_batch_size=8",
        f"batch.global_batch_size={16 * grad_accum}",
        f"schedule.total_steps={total}",
        f"schedule.warmup_steps={WARMUP}",
        f"eval.every_steps={total}",
        "eval.max_batches=1",
        f"checkpoint.every_steps={total}",
        f"logging.peak_flops={peak:.6g}",
    ]


def model_flops_per_token(cfg_path: Path, ov: list[str]) -> tuple[float, int]:
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from pretrain.run.metrics import flops_per_token, untied_input_embedding
    from pretrain.run.models import build_model, count_parameters
    from runconfig import load_config

    cfg = load_config(cfg_path, ov)
    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    model = build_model(cfg.model, tok, cfg.packing.seq_len)
    n = count_parameters(model)
    return flops_per_token(cfg.model, n, cfg.packing.seq_len, untied_input_embedding(model)), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rounds", type=int, default=5, help="alternating rounds (each: our run, then the HF run)"
    )
    ap.add_argument(
        "--grad-accum", type=int, default=1, help="micro-batches per optimizer step (8 x 2 ranks each)"
    )
    ap.add_argument("--steps", type=int, default=MEASURE, help="measured steps (after 3 warm-up steps)")
    ap.add_argument(
        "--set", nargs="*", default=[], help="extra overrides for our side (k=v); results not saved"
    )
    a = ap.parse_args()
    measure = a.steps
    rep = C.Report(__file__, save=not a.set)
    t_start = time.perf_counter()
    ga = a.grad_accum
    sfx = "" if ga == 1 else f"_ga{ga}"
    with tempfile.TemporaryDirectory(prefix="bench-train-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        cfg_path = C.prepare_run(tmp / "data", "roberta", EXTRA_YAML)
        print(f"data stages on BBC: {time.perf_counter() - t0:.0f}s")
        peak = C.cpu_peak_flops(threads=1)
        ov = overrides(peak, ga, measure)
        fpt, n_params = model_flops_per_token(cfg_path, ov)
        rep.line(
            f"model: RoBERTa {n_params / 1e6:.2f}M params, {fpt / 1e6:.1f} MFLOP/token (training); per-rank fp32 "
            f"matmul peak {peak / 1e9:.1f} GFLOP/s (1 thread); micro-batch 8 x 2 ranks x grad-accum {ga}; "
            f"{measure} steps after {WARMUP}"
        )
        ours, hf = [], []

        def run_ours() -> float:
            o = C.run_ours(cfg_path, tmp / "work", [*ov, *a.set], WARMUP)
            ours.append(o)
            print(
                f"  ours: {o['tokens_per_s']:.0f} tokens/s over {o['tokens']} tokens (trainer logged "
                f"{o['logged_tokens']}), step {o['step_s'] * 1e3:.0f} ms, loader wait {o['loader_wait_frac']:.1%}, "
                f"wall {o['wall_s']:.0f}s",
                flush=True,
            )
            return o["tokens_per_s"]

        def run_hf() -> float:
            h = C.run_hf(cfg_path, tmp / "work", ov, WARMUP, "packed")
            hf.append(h)
            print(
                f"  HF Trainer: {h['tokens_per_s']:.0f} tokens/s over {h['tokens']:.0f} tokens, step "
                f"{h['step_s'] * 1e3:.0f} ms ({h['engine']}, {h['distributed_type']}, world {h['world_size']}, "
                f"wall {h['wall_s']:.0f}s)",
                flush=True,
            )
            return h["tokens_per_s"]

        o_tps, h_tps = C.alternate(run_ours, run_hf, a.rounds)
        rep.line(f"ds_config (both sides): {hf[-1]['ds_config']}")
    so, sh = [x["step_s"] * 1e3 for x in ours], [x["step_s"] * 1e3 for x in hf]
    rep.line(
        f"step time at grad-accum {ga} (ms per optimizer step, {a.rounds} rounds): ours median "
        f"{statistics.median(so):.0f} (min {min(so):.0f}, max {max(so):.0f}); HF Trainer median "
        f"{statistics.median(sh):.0f} (min {min(sh):.0f}, max {max(sh):.0f})"
    )
    rep.compare(
        f"train_tokens_per_s_vs_hf_trainer{sfx}", o_tps, h_tps, 1.1, unit="tokens/s, summed over ranks"
    )
    world = 2
    rep.compare(
        f"train_mfu_cpu_vs_hf_trainer{sfx}",
        [x * fpt / (world * peak) for x in o_tps],
        [x * fpt / (world * peak) for x in h_tps],
        1.0,
        unit=f"MFU of {peak / 1e9:.1f} GFLOP/s per rank",
    )
    print(f"total bench time {time.perf_counter() - t_start:.0f}s")
    return rep.finish()


if __name__ == "__main__":
    raise SystemExit(main())
