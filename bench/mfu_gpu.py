"""Model FLOPs utilisation on one GPU: GPT-2 small (seq 1024) and RoBERTa-base (seq 512) in bf16 through our trainer.

Each model is the size preset (`configs/gpt2-small.yaml`: 12 x 768, 12 heads, FFN 3072; `configs/roberta-base.yaml`:
same shape, MLM) trained by `python -m pretrain train` on 1 rank: DeepSpeed ZeRO-2, bf16, the preset's optimizer, a
realistic micro-batch (GPT-2 16 x 1024 tokens, RoBERTa 32 x 512), no gradient accumulation. Data is built here from
the BBC News corpus by our data stages (no network): clean -> dedup -> byte-level BPE -> token shards (GPT-2:
contiguous packing; RoBERTa: FULL-SENTENCES). BBC yields fewer merges than the requested vocabularies, so the
embedding is padded (`model.vocab_pad_multiple`) to the papers' shapes: 50,304 rows for GPT-2 (nanoGPT's padded
50,257) and 50,272 for RoBERTa (50,265 rounded to 8); the parameter counts printed are the trained models'.

What is timed: the trainer's own metrics.jsonl rows after the first WARMUP steps (start-up, the first steps, final
eval and checkpoint excluded). MFU = tokens/s x training FLOPs per token (`pretrain.metrics.flops_per_token`:
6N + 12 L d T, PaLM appendix B, no activation recompute counted) / peak, against (a) the GPU's published dense bf16
peak (H100 SXM and H200: 989 TFLOP/s; H100 PCIe 756, H100 NVL 835, A100 312; `--peak-tflops` overrides) and (b) a
measured peak: the best of 3 timings of 50 bf16 8192^3 matmuls in this process (what cuBLAS really reaches here).

Without CUDA the script prints `skipped (no GPU)` VERDICTs and exits 0. `--smoke` runs the whole path on CPU with
tiny models (2 layers, 64 wide, seq 64, fp32 unless --smoke-bf16) to prove the script works; its MFU is against the
measured CPU matmul peak and is not a result.

`python bench/mfu_gpu.py [--steps 40] [--warmup 10] [--smoke]`
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

PUBLISHED_BF16_DENSE = [  # (substring of torch.cuda.get_device_name(), TFLOP/s), first match wins
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("GH200", 989.0),
    ("A100", 312.0), ("L40S", 362.0), ("A10G", 70.0),
]  # fmt: skip

MODELS = {
    # name: (family, preset, seq_len, micro-batch, requested vocabulary, padded embedding rows)
    "gpt2_small": ("gpt2", "gpt2-small", 1024, 16, 50257, 50304),
    "roberta_base": ("roberta", "roberta-base", 512, 32, 50265, 50272),
}
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

    from data_pipeline.layout import RunLayout
    from runconfig import load_config

    return len(AutoTokenizer.from_pretrained(str(RunLayout(load_config(cfg_path)).tokenizer)))


def run_model(name: str, tmp: Path, cleaned: Path | None, a, env: dict[str, str], peak: float) -> dict:
    from transformers import AutoTokenizer

    from data_pipeline.layout import RunLayout
    from pretrain.metrics import flops_per_token
    from pretrain.models import build_model, count_parameters
    from runconfig import load_config

    family, preset, seq, micro, vocab, rows = MODELS[name]
    if a.smoke:
        seq, micro, vocab, rows = 64, 4, 1000, 8
    extra = f"tokenizer: {{vocab_size: {vocab}}}\npacking: {{seq_len: {seq}}}\n"
    if family == "roberta":
        extra += f"model: {{max_position_embeddings: {seq + 2}}}\n"
    t0 = time.perf_counter()
    cfg_path = C.prepare_run(tmp / name, family, extra, preset=None if a.smoke else preset, cleaned_from=cleaned,
                             env=env)  # fmt: skip
    n_tok = tokenizer_len(cfg_path)
    pad_multiple = rows if n_tok <= rows else 8
    total = a.warmup + a.steps
    precision = "bf16" if (not a.smoke or a.smoke_bf16) else "fp32"
    ov = [f"batch.micro_batch_size={micro}", f"batch.global_batch_size={micro}", "launch.nodes=1",
          "launch.procs_per_node=1", f"launch.backend={'gloo' if a.smoke else 'nccl'}", "deepspeed.zero_stage=2",
          f"deepspeed.precision={precision}", f"model.vocab_pad_multiple={pad_multiple}",
          f"schedule.total_steps={total}", f"schedule.warmup_steps={a.warmup}", f"eval.every_steps={total}",
          "eval.max_batches=1", f"checkpoint.every_steps={total}", f"loader.num_workers={a.workers}",
          f"logging.peak_flops={peak:.6g}"]  # fmt: skip
    if a.smoke:
        ov += SMOKE
    cfg = load_config(cfg_path, ov)
    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    n_params = count_parameters(build_model(cfg.model, tok, seq))
    fpt = flops_per_token(cfg.model, n_params, seq)
    print(f"[{name}] data stages {time.perf_counter() - t0:.0f}s; tokenizer {n_tok} entries, embedding rows "
          f"{-(-n_tok // pad_multiple) * pad_multiple}; {n_params / 1e6:.1f}M params, {fpt / 1e9:.3f} GFLOP/token; "
          f"{precision}, micro-batch {micro} x {seq}", flush=True)  # fmt: skip
    r = C.run_ours(cfg_path, tmp / f"{name}-work", ov, a.warmup, nproc=1, env=env)
    r.update(params=n_params, flops_per_token=fpt, cfg_path=cfg_path)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="measured steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=10, help="steps excluded from the window; also the log interval")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (loader.num_workers)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="published bf16 dense peak, if not in the table")
    ap.add_argument("--smoke", action="store_true", help="tiny models on CPU: checks the script, not a result")
    ap.add_argument("--smoke-bf16", action="store_true", help="with --smoke: bf16 instead of fp32")
    a = ap.parse_args()
    if a.smoke:
        a.steps, a.warmup = min(a.steps, 6), min(a.warmup, 2)

    import torch

    have_gpu = torch.cuda.is_available()
    if not have_gpu and not a.smoke:
        for name in MODELS:
            print(f"VERDICT mfu_gpu_{name}: ours=n/a peer=989 ratio=n/a goal=0.5 skipped (no GPU)")
        return 0

    device = "cuda" if have_gpu and not a.smoke else "cpu"
    env = C.child_env(threads=1 if device == "cpu" else 8, accelerator=device)
    if device == "cuda":
        gpu = torch.cuda.get_device_name(0)
        pub = a.peak_tflops * 1e12 if a.peak_tflops else published_peak(gpu)
        meas = measured_peak("cuda")
        print(f"GPU: {gpu}; published bf16 dense peak "
              f"{'unknown' if pub is None else f'{pub / 1e12:.0f} TFLOP/s'}; measured bf16 matmul peak "
              f"{meas / 1e12:.0f} TFLOP/s", flush=True)  # fmt: skip
    else:
        gpu, pub = "CPU (smoke)", None
        meas = measured_peak("cpu")
        print(f"SMOKE on CPU: tiny models, measured fp32 matmul peak {meas / 1e9:.1f} GFLOP/s (1 thread)", flush=True)

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-mfu-") as d:
        tmp = Path(d)
        cleaned = None
        for name in MODELS:
            try:
                r = run_model(name, tmp, cleaned, a, env, pub or meas)
            except Exception as e:  # report and go on to the next model
                print(f"[{name}] FAILED: {str(e)[-3000:]}", flush=True)
                results[name] = {"error": str(e).splitlines()[0][:200]}
                continue
            cleaned = cleaned or tmp / name
            results[name] = r
            achieved = r["tokens_per_s"] * r["flops_per_token"]
            r["mfu_published"] = achieved / pub if pub else None
            r["mfu_measured"] = achieved / meas
            vs_pub = "n/a" if pub is None else f"{r['mfu_published']:.1%}"
            print(f"[{name}] {r['tokens_per_s']:.0f} tokens/s over {r['tokens']} tokens "
                  f"({r['seconds']:.1f}s steady state), {achieved / 1e12:.2f} TFLOP/s achieved; MFU "
                  f"{vs_pub} of published, "
                  f"{r['mfu_measured']:.1%} of measured peak; loader wait {r['loader_wait_frac']:.1%}; "
                  f"logged MFU {r['mfu_logged']:.1%}", flush=True)  # fmt: skip

    for name in MODELS:
        r = results[name]
        if device == "cpu":
            ok = "error" not in r
            print(f"SMOKE {name}: {'ran' if ok else 'FAILED'}"
                  + (f", MFU vs measured CPU peak {r['mfu_measured']:.3f}" if ok else f" ({r['error']})"))  # fmt: skip
            print(f"VERDICT mfu_gpu_{name}: ours=n/a peer=989 ratio=n/a goal=0.5 skipped (no GPU)")
            continue
        if "error" in r:
            print(f"VERDICT mfu_gpu_{name}: ours=n/a peer={(pub or 0) / 1e12:.0f} ratio=n/a goal=0.5 fail "
                  f"(run failed: {r['error']})")  # fmt: skip
            continue
        if pub is not None:
            m = r["mfu_published"]
            print(f"VERDICT mfu_gpu_{name}: ours={m:.3f} peer={pub / 1e12:.0f} ratio={m:.3f} goal=0.5 "
                  f"{'pass' if m >= 0.5 else 'fail'}")  # fmt: skip
        m = r["mfu_measured"]
        print(f"VERDICT mfu_gpu_{name}_vs_measured_peak: ours={m:.3f} peer={meas / 1e12:.0f} ratio={m:.3f} goal=0.5 "
              f"{'pass' if m >= 0.5 else 'fail'}")  # fmt: skip
    print(json.dumps({"device": gpu, **{k: {kk: vv for kk, vv in v.items() if kk != "cfg_path"}
                                        for k, v in results.items()}}, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
