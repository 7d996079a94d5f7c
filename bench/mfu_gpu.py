"""Model FLOPs utilisation on one GPU, bf16, through our trainer: GPT-2 small and medium (seq 1024), RoBERTa-base
(seq 512), each with DeepSpeed ZeRO-1 and ZeRO-2 and activation checkpointing off and on.

Each model is the size preset (`configs/gpt2-small.yaml` 12 x 768, `configs/gpt2-medium.yaml` 24 x 1024,
`configs/roberta-base.yaml` 12 x 768 MLM) trained by `python -m pretrain train` on 1 rank with the preset's
optimizer, a realistic micro-batch (GPT-2 16 x 1024 tokens, RoBERTa 32 x 512), no gradient accumulation. Data is
built here from the BBC News corpus by our data stages (no network): clean -> dedup -> byte-level BPE -> token
shards (GPT-2: contiguous packing; RoBERTa: FULL-SENTENCES). BBC yields fewer merges than the requested
vocabularies, so the embedding is padded (`model.vocab_pad_multiple`) to the papers' shapes: 50,304 rows for GPT-2
(nanoGPT's padded 50,257) and 50,272 for RoBERTa (50,265 rounded to 8); the parameter counts are the trained models'.

What is timed: the trainer's own metrics.jsonl rows after the first WARMUP steps (start-up, the first steps, final
eval and checkpoint excluded). MFU = tokens/s x training FLOPs per token (`pretrain.run.metrics.flops_per_token`:
6N + 12 L d T, PaLM appendix B; activation recompute is not counted, so checkpointing lowers MFU by design) / the
device's peak: its published dense bf16 peak (H100 SXM and H200: 989 TFLOP/s; H100 PCIe 756, H100 NVL 835, A100
312; `--peak-tflops` overrides), and, printed next to it, a peak measured in this run (best of 3 timings of 50 bf16
8192^3 matmuls: what cuBLAS reaches here).
Every configuration of the matrix runs once (MFU lines); the VERDICT configurations (GPT-2 medium, ZeRO-1 and
ZeRO-2, checkpointing off: goal >= 45% of the published peak) run `--rounds` times (default 5), median, min, max.

Without CUDA the script prints `SKIP` (no VERDICT) and exits 0, writing nothing. `--smoke` runs the same path on
CPU with tiny models (2 layers, 64 wide, seq 64; fp32 unless --smoke-bf16, gloo) over the matrix chosen with
--models/--zero/--ckpt, to prove the script works unattended; its figures are not results and are not saved.

`python bench/mfu_gpu.py [--steps 40] [--warmup 10] [--rounds 5] [--models ...] [--zero 1 2] [--ckpt off on]`
(on an H100: about 15 minutes for the whole matrix; split it with --models to stay under a 10-minute limit, and give
`--time-limit 540` so the script itself stops starting runs in time and still prints its VERDICT lines. Measured on
an H100 SXM, 2026-11-22: GPT-2 medium ZeRO-1 16.7% MFU eager with HF's composed GELU, 20.7% with the fused GELU and
torch.compile; each run takes ~60-90 s of which ~12 s train, the first compile ~190 s.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

PUBLISHED_BF16_DENSE = [  # (substring of torch.cuda.get_device_name(), TFLOP/s), first match wins
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("A10G", 70.0),
]

MODELS = {
    # name: (family, preset, seq_len, micro-batch, requested vocabulary, padded embedding rows)
    "gpt2_small": ("gpt2", "gpt2-small", 1024, 16, 50257, 50304),
    "gpt2_medium": ("gpt2", "gpt2-medium", 1024, 16, 50257, 50304),
    "roberta_base": ("roberta", "roberta-base", 512, 32, 50265, 50272),
}
VERDICT_CONFIGS = {
    ("gpt2_medium", 1, "off"): 0.45,
    ("gpt2_medium", 2, "off"): 0.45,
}  # (model, zero, ckpt): goal
SMOKE = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=256"]


def published_peak(name: str) -> float | None:
    for key, tflops in PUBLISHED_BF16_DENSE:
        if key in name:
            return tflops * 1e12
    return None


def measured_peak(device: str) -> float:
    """Best of 3: 50 bf16 8192^3 matmuls on the GPU (fp32 1024^3 with 1 thread on CPU for --smoke)."""
    import torch

    if device == "cpu":
        return C.cpu_peak_flops(threads=int(os.environ.get("OMP_NUM_THREADS", "1")))
    n, reps = 8192, 50
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    best = 0.0
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    del a, b
    torch.cuda.empty_cache()
    return best


def tokenizer_len(cfg_path: Path) -> int:
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from runconfig import load_config

    return len(AutoTokenizer.from_pretrained(str(RunLayout(load_config(cfg_path)).tokenizer)))


def prepare(name: str, tmp: Path, cleaned: Path | None, a, env: dict[str, str]) -> tuple[Path, int]:
    family, preset, seq, _, vocab, rows = MODELS[name]
    if a.smoke:
        seq, vocab, rows = 64, 1000, 8
    extra = f"tokenizer: {{vocab_size: {vocab}}}\npacking: {{seq_len: {seq}}}\n"
    if family == "roberta":
        extra += f"model: {{max_position_embeddings: {seq + 2}}}\n"
    cfg_path = C.prepare_run(
        tmp / name,
        family,
        extra,
        preset=None if a.smoke else preset,
        cleaned_from=cleaned,
        env=env,
        files="0[0-4]?.txt" if a.smoke else None,
    )
    n_tok = tokenizer_len(cfg_path)
    return cfg_path, rows if n_tok <= rows else 8


def run_model(
    name: str,
    cfg_path: Path,
    pad_multiple: int,
    zero: int,
    ckpt: str,
    tmp: Path,
    a,
    env: dict[str, str],
    peak: float,
) -> dict:
    import torch
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from pretrain.run.metrics import flops_per_token, untied_input_embedding
    from pretrain.run.models import build_model, count_parameters
    from runconfig import load_config

    family, preset, seq, micro, vocab, rows = MODELS[name]
    if a.smoke:
        seq, micro = 64, 4
    total = a.warmup + a.steps
    precision = "bf16" if (not a.smoke or a.smoke_bf16) else "fp32"
    ov = [
        f"batch.micro_batch_size={micro}",
        f"batch.global_batch_size={micro}",
        "launch.nodes=1",
        "launch.procs_per_node=1",
        f"launch.backend={'gloo' if a.smoke else 'nccl'}",
        f"deepspeed.zero_stage={zero}",
        f"deepspeed.activation_checkpointing={'true' if ckpt == 'on' else 'false'}",
        f"deepspeed.precision={precision}",
        f"model.vocab_pad_multiple={pad_multiple}",
        f"schedule.total_steps={total}",
        f"schedule.warmup_steps={a.warmup}",
        f"eval.every_steps={total}",
        "eval.max_batches=1",
        f"checkpoint.every_steps={total}",
        f"loader.num_workers={a.workers}",
        f"logging.peak_flops={peak:.6g}",
    ]
    if a.smoke:
        ov += SMOKE
    cfg = load_config(cfg_path, ov)
    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    with torch.device("meta"):  # shapes only: no 355M-parameter initialisation on the host per run
        model = build_model(cfg.model, tok, seq)
        n_params, input_embedding = count_parameters(model), untied_input_embedding(model)
    fpt = flops_per_token(cfg.model, n_params, seq, input_embedding)
    r = C.run_ours(cfg_path, tmp / f"{name}-work", ov, a.warmup, nproc=1, env=env)
    r.update(params=n_params, flops_per_token=fpt, achieved=r["tokens_per_s"] * fpt)
    print(
        f"[{name} zero{zero} ckpt {ckpt}] {n_params / 1e6:.1f}M params, {precision}, micro-batch {micro} x {seq}: "
        f"{r['tokens_per_s']:.0f} tokens/s, {r['achieved'] / 1e12:.2f} TFLOP/s, MFU {r['achieved'] / peak:.1%}; "
        f"loader wait {r['loader_wait_frac']:.1%}; wall {r['wall_s']:.0f}s",
        flush=True,
    )
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="measured steps (after --warmup)")
    ap.add_argument(
        "--warmup", type=int, default=10, help="steps excluded from the window; also the log interval"
    )
    ap.add_argument("--rounds", type=int, default=5, help="runs of each VERDICT configuration")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--zero", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    ap.add_argument(
        "--ckpt", nargs="+", default=["off", "on"], choices=["off", "on"], help="activation checkpointing"
    )
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (loader.num_workers)")
    ap.add_argument(
        "--peak-tflops", type=float, default=None, help="published bf16 dense peak, if not in the table"
    )
    ap.add_argument(
        "--time-limit",
        type=float,
        default=0,
        help="seconds: start no run that would end past it "
        "(a lent device's per-command limit); VERDICTs from fewer than 5 runs are marked quick",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="tiny models on CPU: checks the script, not a result"
    )
    ap.add_argument("--smoke-bf16", action="store_true", help="with --smoke: bf16 instead of fp32")
    a = ap.parse_args()
    if a.smoke:
        a.steps, a.warmup, a.rounds = min(a.steps, 6), min(a.warmup, 2), 1

    import torch

    have_gpu = torch.cuda.is_available()
    if not have_gpu and not a.smoke:
        print("SKIP mfu_gpu: no CUDA device here (run it on a GPU machine; `--smoke` checks the CPU path)")
        return 0
    rep = C.Report(__file__, save=not a.smoke)
    device = "cuda" if have_gpu and not a.smoke else "cpu"
    env = C.child_env(threads=1 if device == "cpu" else 8, accelerator=device)
    if device == "cuda":
        gpu = torch.cuda.get_device_name(0)
        pub = a.peak_tflops * 1e12 if a.peak_tflops else published_peak(gpu)
        meas = measured_peak("cuda")
        if pub is None:
            raise SystemExit(f"no published bf16 peak known for {gpu}: pass --peak-tflops")
        rep.line(
            f"device: {gpu}; published bf16 dense peak {pub / 1e12:.0f} TFLOP/s; measured bf16 matmul peak "
            f"{meas / 1e12:.0f} TFLOP/s"
        )
    else:
        gpu = "CPU (smoke)"
        pub = meas = measured_peak("cpu")
        rep.line(f"SMOKE on CPU: tiny models, measured fp32 matmul peak {meas / 1e9:.1f} GFLOP/s (1 thread)")

    mfu: dict[tuple[str, int, str], list[float]] = {}
    failed: dict[tuple[str, int, str], str] = {}
    t_start, last_wall = time.monotonic(), 0.0
    with tempfile.TemporaryDirectory(prefix="bench-mfu-") as d:
        tmp = Path(d)
        cleaned = None
        for name in a.models:
            try:
                cfg_path, pad_multiple = prepare(name, tmp, cleaned, a, env)
            except Exception as e:
                for zero in a.zero:
                    for ckpt in a.ckpt:
                        failed[name, zero, ckpt] = f"data preparation failed: {str(e)[-300:]}"
                continue
            cleaned = cleaned or tmp / name
            for zero in a.zero:
                for ckpt in a.ckpt:
                    key = (name, zero, ckpt)
                    rounds = a.rounds if key in VERDICT_CONFIGS else 1
                    for _ in range(rounds):
                        spent = time.monotonic() - t_start
                        if a.time_limit and key in mfu and spent + last_wall > a.time_limit:
                            rep.line(
                                f"[{name} zero{zero} ckpt {ckpt}] --time-limit {a.time_limit:.0f}s: stopped after "
                                f"{len(mfu[key])} runs (elapsed {spent:.0f}s, last run {last_wall:.0f}s)"
                            )
                            break
                        if a.time_limit and key not in mfu and spent > a.time_limit:
                            failed[key] = f"not run: --time-limit {a.time_limit:.0f}s reached"
                            break
                        t_run = time.monotonic()
                        try:
                            r = run_model(name, cfg_path, pad_multiple, zero, ckpt, tmp, a, env, pub)
                        except Exception as e:  # report and go on to the next configuration
                            print(f"[{name} zero{zero} ckpt {ckpt}] FAILED: {str(e)[-3000:]}", flush=True)
                            failed[key] = str(e).splitlines()[0][:200]
                            break
                        mfu.setdefault(key, []).append(r["achieved"] / pub)
                        last_wall = time.monotonic() - t_run
                    if key in mfu:
                        xs = mfu[key]
                        rep.line(
                            f"MFU {name} zero{zero} activation-checkpointing {ckpt}: median {statistics.median(xs):.1%}"
                            f" (min {min(xs):.1%}, max {max(xs):.1%}, {len(xs)} runs) of {pub / 1e12:.3g} TFLOP/s; "
                            f"{statistics.median(xs) * pub / meas:.1%} of the measured matmul peak"
                        )
    for key, err in failed.items():
        rep.line(f"FAILED {key[0]} zero{key[1]} activation-checkpointing {key[2]}: {err}")
    if device == "cpu":  # the smoke run proves the path; its figures are no result
        for key in [(m, z, c) for m in a.models for z in a.zero for c in a.ckpt]:
            rep.line(f"SMOKE {' '.join(map(str, key))}: {'ran' if key in mfu else 'FAILED'}")
        print(json.dumps({"device": gpu, "failed": {" ".join(map(str, k)): v for k, v in failed.items()}}))
        return 1 if failed else 0
    for key, goal in VERDICT_CONFIGS.items():
        name, zero, ckpt = key
        if name not in a.models or zero not in a.zero or ckpt not in a.ckpt:
            continue
        label = f"mfu_gpu_{name}_zero{zero}_bf16"
        xs = mfu.get(key, [0.0])  # a failed configuration fails its VERDICT
        if len(xs) < C.MIN_ROUNDS:
            rep.quick.append(label)
        m = statistics.median(xs)
        rep.verdict(label, m * pub / 1e12, pub / 1e12, goal)  # ours = achieved TFLOP/s, peer = the peak
    print(
        json.dumps(
            {
                "device": gpu,
                "mfu": {" ".join(map(str, k)): v for k, v in mfu.items()},
                "failed": {" ".join(map(str, k)): v for k, v in failed.items()},
            }
        )
    )
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
