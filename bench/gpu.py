"""One short GPU slot (<= 8 minutes on one H100, compilation included): MFU of our trainer against a plain PyTorch
loop written as a performance engineer would, on GPT-2 medium at gradient accumulation 1 and 4 and on a 1.1B Llama
(TinyLlama's shape, `configs/llama-1b.yaml`).

Ours: `python -m pretrain train` on one rank with the GPU preset (`configs/gpt2-medium.yaml`, `configs/llama-1b.yaml`:
dropout 0, no KV cache, chunked LM-head loss, torch.compile per block, no activation checkpointing), ZeRO-1, bf16.
The peer, in this process: the same transformers model (`pretrain.run.models.build_model`) in fp32 under bf16 autocast,
each decoder block compiled (torchtitan's regional compile), SDPA (flash on a GPU), fused AdamW, foreach gradient
clipping, transformers' own loss, the same micro-batch, accumulation and token samples (read from the same shards,
already on the device: the peer pays no loader time). Data comes from the BBC News corpus through our data stages
(no network; the embedding is padded to the papers' rows as in bench/mfu_gpu.py).

Each configuration runs in its own process (a clean device and process group), which holds both sides: our
trainer's own set-up and step (`pretrain.run.train.set_up` and `pretrain.run.step.train_step`: the same code `python -m pretrain train`
runs, loader included) and the peer loop. After `--warmup` steps of each (compilation included there), a round is one
window of `--window` optimizer steps of one side, synchronized at both ends, and the sides alternate, the first
side swapping every round (ours, peer, peer, ours, ...), so a drift of the machine falls on both alike.
MFU = tokens/s x FLOPs per token (`pretrain.tools.plan.config_flops_per_token`: PaLM appendix B as the trainer counts it,
without an untied input embedding) / the published dense bf16 peak (bench/mfu_gpu.py's table; `--peak-tflops`
overrides). VERDICT lines: MFU >= 0.40 (GPT-2 medium, accumulation
1), >= 0.45 (accumulation 4), >= 0.41 (Llama 1.1B); ours/peer >= 1.0 for each. After the timing, two more steps of
each side are profiled: our trainer's through its own `logging.profile_steps` profiler (top kernels, device idle
fraction, host reads and synchronizations per step), the peer's as a top-kernel table.

`python bench/gpu.py [--configs ...] [--warmup 6] [--window 4] [--rounds 5] [--time-limit 480]`; without CUDA it
prints SKIP and exits 0. `--smoke` runs the same path on CPU with tiny models (2 layers, 64 wide, seq 64, fp32, the
`aot_eager` backend): it proves the script, its figures are no result and nothing is written.
What a machine without network needs is in docs/training.md ("bench/gpu.py on a machine without network").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import mfu_gpu  # noqa: E402  (the published-peak table and measured matmul peak)

CONFIGS = {
    # name: (family, preset, seq_len, micro-batch, grad accumulation, requested vocabulary, padded rows, MFU goal)
    "gpt2_medium_accum1": ("gpt2", "gpt2-medium", 1024, 16, 1, 50257, 50304, 0.40),
    "gpt2_medium_accum4": ("gpt2", "gpt2-medium", 1024, 16, 4, 50257, 50304, 0.45),
    "llama_1b": ("llama", "llama-1b", 2048, 8, 4, 32000, 32000, 0.41),
}
SMOKE = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=256"]
SMOKE_LLAMA = ["model.options.num_kv_heads=1"]


def overrides(name: str, a, pad_multiple: int) -> list[str]:
    family, _, seq, micro, accum, *_ = CONFIGS[name]
    if a.smoke:
        seq, micro = 64, 2
    total = a.warmup + a.window * a.rounds + 2  # + the two profiled steps of our trainer
    ov = [
        f"batch.micro_batch_size={micro}",
        f"batch.global_batch_size={micro * accum}",
        "launch.nodes=1",
        "launch.procs_per_node=1",
        f"launch.backend={'gloo' if a.smoke else 'nccl'}",
        "deepspeed.zero_stage=1",
        f"deepspeed.precision={'fp32' if a.smoke else 'bf16'}",
        f"model.vocab_pad_multiple={pad_multiple}",
        f"schedule.total_steps={total}",
        f"schedule.warmup_steps={a.warmup}",
        f"eval.every_steps={total}",
        "eval.max_batches=1",
        f"checkpoint.every_steps={total}",
        "loader.num_workers=2",
        f"packing.seq_len={seq}",
        "deepspeed.compile=true",
    ]
    if a.smoke:
        ov += SMOKE + (SMOKE_LLAMA if family == "llama" else []) + ["deepspeed.compile_backend=aot_eager"]
    return ov


def prepare(name: str, tmp: Path, a, env: dict[str, str]) -> tuple[Path, int]:
    family, preset, seq, _, _, vocab, rows, _ = CONFIGS[name]
    if a.smoke:
        seq, vocab, rows = 64, 1000, 8
    extra = f"tokenizer: {{vocab_size: {vocab}}}\npacking: {{seq_len: {seq}}}\n"
    cfg_path = C.prepare_run(
        tmp / name,
        family,
        extra,
        preset=None if a.smoke else preset,
        env=env,
        files="0[0-4]?.txt" if a.smoke else None,
    )
    return cfg_path, rows if mfu_gpu.tokenizer_len(cfg_path) <= rows else 8


def run_child(name: str, cfg_path: Path, pad: int, tmp: Path, a, env: dict[str, str]) -> dict:
    """Both sides of one configuration in a fresh process (see `measure`); returns its rates and profiles."""
    import shutil

    run_dir = tmp / "ours"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (run_dir / stage).symlink_to(cfg_path.parent / "run" / stage)
    args = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--child-config",
        str(cfg_path),
        "--child-pad",
        str(pad),
        "--child-out",
        str(run_dir),
        "--warmup",
        str(a.warmup),
        "--window",
        str(a.window),
        "--rounds",
        str(a.rounds),
        *(["--smoke"] if a.smoke else []),
    ]
    res = C.run_cmd(args, timeout=900, env=env)
    print(res.stdout[-12000:], flush=True)
    return json.loads(
        next(x for x in reversed(res.stdout.splitlines()) if x.startswith(RESULT))[len(RESULT) :]
    )


RESULT = "RESULT "


class PlainLoop:
    """The peer: the same transformers model in fp32 under bf16 autocast, each block compiled, fused AdamW, foreach
    clipping, transformers' own loss, the same token samples already on the device."""

    def __init__(self, cfg, n_steps: int, device: str):
        import numpy as np
        import torch
        from transformers import AutoTokenizer

        from core.run_layout import RunLayout
        from data_pipeline.loader import PretrainLoader
        from pretrain.run.models import build_model

        self.device, self.torch = device, torch
        self.micro, self.accum, seq = (
            cfg.batch.micro_batch_size,
            cfg.batch_plan()["grad_accum"],
            cfg.packing.seq_len,
        )
        tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
        torch.manual_seed(0)
        self.model = build_model(cfg.model, tok, seq).to(device).train()
        self.model.config.use_cache = False
        layers = self.model.transformer.h if cfg.model.family == "gpt2" else self.model.model.layers
        for layer in layers:
            layer.compile(backend=cfg.deepspeed.compile_backend)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=device == "cuda"
        )
        ld = PretrainLoader(cfg, 0, 1, collate_fn=lambda x: x)
        n = self.micro * self.accum * n_steps
        rows = [np.asarray(ld.sources[s][i]["input_ids"]) for s, i, _ in ld.positions_keys(np.arange(n))]
        self.batches = torch.from_numpy(np.stack(rows)).long().to(device).view(-1, self.micro, seq)
        self.k = 0

    def step(self) -> None:
        torch, cuda = self.torch, self.device == "cuda"
        for _ in range(self.accum):
            ids = self.batches[self.k % len(self.batches)]
            self.k += 1
            with torch.autocast(self.device, dtype=torch.bfloat16, enabled=cuda):
                loss = self.model(input_ids=ids, labels=ids).loss / self.accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=cuda)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def measure(a) -> int:
    """The child: our trainer (its own set-up and step) and the peer, warmed up, then alternating windows."""
    import torch
    import torch.distributed as dist

    from pretrain.run import train as T
    from pretrain.run.engine import init_distributed
    from pretrain.run.profiler import StepProfiler
    from pretrain.run.step import train_step
    from runconfig import load_config

    n_steps = a.warmup + a.window * a.rounds + 2
    ov = [
        f"run.output_dir={a.child_out}",
        "logging.progress_bar=false",
        "checkpoint.keep_last=1",
        *overrides(a.child, a, a.child_pad),
    ]
    cfg = load_config(a.child_config, ov)
    init_distributed(cfg)
    run, progress, _ = T.set_up(cfg)
    meter = T.make_meter(run)
    run.callbacks.start(run, progress)  # the watchdog, the sinks: as the loop starts them
    run.engine.train()
    batches = iter(run.train_loader)
    run.clock.start()
    device = run.device.type
    peer = PlainLoop(cfg, n_steps, device)

    def ours_step() -> None:
        train_step(run, progress, batches, meter)
        progress.step += 1

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    tokens = a.window * run.plan.grad_accum * cfg.batch.micro_batch_size * cfg.packing.seq_len
    for _ in range(a.warmup):
        ours_step()
        peer.step()
    rates: dict[str, list[float]] = {"ours": [], "peer": []}
    sides = {"ours": ours_step, "peer": peer.step}
    for r in range(a.rounds):
        for side in ("ours", "peer") if r % 2 == 0 else ("peer", "ours"):
            sync()
            t0 = time.perf_counter()
            for _ in range(a.window):
                sides[side]()
            sync()
            rates[side].append(tokens / (time.perf_counter() - t0))
    first = progress.step + 1
    profiler = StepProfiler((first, first + 2), Path(a.child_out) / "logs", 0, run.device)
    for _ in range(2):
        profiler.begin(progress.step + 1)
        ours_step()
        profiler.end(progress.step)
    ours_summary = (Path(a.child_out) / "logs" / "profile" / "summary-rank0.txt").read_text()
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            peer.step()
        sync()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    peer_table = prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=70)
    run.callbacks.end(run, progress)
    dist.destroy_process_group()
    print(f"[{a.child}] our trainer's profile, 2 steps:\n{ours_summary}", flush=True)
    print(f"[{a.child}] peer profile, 2 steps:\n{peer_table}", flush=True)
    print(RESULT + json.dumps(rates), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument(
        "--warmup", type=int, default=6, help="optimizer steps before the first window (compiles)"
    )
    ap.add_argument("--window", type=int, default=4, help="optimizer steps per measurement window (a round)")
    ap.add_argument("--rounds", type=int, default=C.MIN_ROUNDS, help="windows per configuration and side")
    ap.add_argument(
        "--peak-tflops", type=float, default=None, help="published bf16 dense peak, if not in the table"
    )
    ap.add_argument("--time-limit", type=float, default=480, help="seconds: start no configuration past it")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny models on CPU: checks the script, not a result"
    )
    ap.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)  # one configuration's process
    ap.add_argument("--child-config", help=argparse.SUPPRESS)
    ap.add_argument("--child-pad", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return measure(a)
    if a.smoke:
        a.warmup, a.window, a.rounds = 1, 1, 2

    import torch

    have_gpu = torch.cuda.is_available()
    if not have_gpu and not a.smoke:
        print("SKIP gpu: no CUDA device here (run it on a GPU machine; `--smoke` checks the CPU path)")
        return 0
    device = "cuda" if have_gpu and not a.smoke else "cpu"
    rep = C.Report(__file__, save=not a.smoke)
    env = C.child_env(threads=1 if device == "cpu" else 8, accelerator=device)
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        peak = a.peak_tflops * 1e12 if a.peak_tflops else mfu_gpu.published_peak(name)
        if peak is None:
            raise SystemExit(f"no published bf16 peak known for {name}: pass --peak-tflops")
        rep.line(
            f"device: {name}; published bf16 dense peak {peak / 1e12:.0f} TFLOP/s; torch {torch.__version__}"
        )
    else:
        peak = mfu_gpu.measured_peak("cpu")
        rep.line(f"SMOKE on CPU: tiny models, measured fp32 matmul peak {peak / 1e9:.1f} GFLOP/s (1 thread)")

    from pretrain.tools.plan import config_flops_per_token
    from runconfig import load_config

    t0, results, failed = time.monotonic(), {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as d:
        tmp = Path(d)
        for name in a.configs:
            if time.monotonic() - t0 > a.time_limit:
                failed[name] = f"not run: --time-limit {a.time_limit:.0f}s reached"
                continue
            try:
                t_cfg = time.monotonic()
                cfg_path, pad = prepare(name, tmp, a, env)
                ov = overrides(name, a, pad)
                cfg = load_config(cfg_path, ov)
                fpt = config_flops_per_token(cfg)
                rates = run_child(name, cfg_path, pad, tmp / name, a, env)
                ours, peer = rates["ours"], rates["peer"]
            except Exception as e:  # report and go on to the next configuration
                print(f"[{name}] FAILED: {str(e)[-3000:]}", flush=True)
                failed[name] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                continue
            n = min(len(ours), len(peer))
            results[name] = (ours[:n], peer[:n], fpt)
            rep.line(
                f"[{name}] {fpt / 1e9:.3f} GFLOP/token; ours {statistics.median(ours):.0f} tokens/s "
                f"(MFU {statistics.median(ours) * fpt / peak:.1%}), peer {statistics.median(peer):.0f} tokens/s "
                f"(MFU {statistics.median(peer) * fpt / peak:.1%}); {time.monotonic() - t_cfg:.0f}s"
            )
    for name, err in failed.items():
        rep.line(f"FAILED {name}: {err}")
    if device == "cpu":  # the smoke run proves the path; its figures are no result
        for name in a.configs:
            rep.line(f"SMOKE {name}: {'ran' if name in results and results[name][0] else 'FAILED'}")
        return 1 if failed or any(not r[0] for r in results.values()) else 0
    for name in a.configs:
        goal = CONFIGS[name][-1]
        ours, peer, fpt = results.get(name, ([0.0], [1.0], 0.0))  # a failed configuration fails its VERDICTs
        rep.verdict(f"gpu_mfu_{name}", statistics.median(ours) * fpt / 1e12, peak / 1e12, goal)
        rep.compare(f"gpu_vs_plain_torch_{name}", ours, peer, 1.0, unit="tokens/s")
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
