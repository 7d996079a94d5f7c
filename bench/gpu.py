"""One short GPU slot (<= 8 minutes on one H100 or H200, compilation included): MFU of our trainer against a plain
PyTorch loop written as a performance engineer would, on GPT-2 medium at gradient accumulation 1 and 4 and on a 1.1B
Llama (TinyLlama's shape, `configs/llama-1b.yaml`), the Llama also with FP8 (`model.float8`) against our bf16, and
each configuration's first step.

Ours: `python -m pretrain train` on one rank with the GPU preset (`configs/gpt2-medium.yaml`, `configs/llama-1b.yaml`:
dropout 0, no KV cache, chunked LM-head loss, torch.compile per block, no activation checkpointing), ZeRO-1, bf16.
The peer, in this process: the same transformers model (`pretrain.run.models.build_model`) in fp32 under bf16 autocast,
each decoder block compiled (torchtitan's regional compile), SDPA (flash on a GPU), fused AdamW, foreach gradient
clipping, transformers' own loss, the same micro-batch, accumulation and token samples (read from the same shards,
already on the device: the peer pays no loader time). Data comes from the BBC News corpus through our data stages
(no network; the embedding is padded to the papers' rows as in bench/mfu_gpu.py). For the Llama a third side is our
trainer again with `model.float8` (`--fp8-recipe`, default tensorwise, torchao's faster recipe), set up with the same
seed on the same data: after the timed steps both trainers' held-out loss is taken on `--eval-batches` micro-batches.

Each configuration runs in its own process (a clean device and process group), which holds every side: our
trainer's own set-up and step (`pretrain.run.train.set_up` and `pretrain.run.step.train_step`: the same code `python -m
pretrain train` runs, loader included) and the peer loop. Each side's first optimizer step is timed alone
(compilation included), then `--warmup` steps of each; a round is one window of `--window` optimizer steps of one
side, synchronized at both ends, and the sides alternate, their order reversing every round, so a drift of the
machine falls on all alike. MFU = tokens/s x FLOPs per token (`pretrain.tools.plan.config_flops_per_token`: PaLM
appendix B as the trainer counts it, without an untied input embedding) / the published dense bf16 peak
(bench/mfu_gpu.py's table; `--peak-tflops` overrides). VERDICT lines: MFU >= 0.42 (GPT-2 medium, accumulation 1),
>= 0.48 (accumulation 4), >= 0.58 (Llama 1.1B, bf16); ours/peer >= 1.0 for each; FP8 tokens/s >= 1.2x our bf16 with
a held-out loss within 1% of bf16's; each first step <= 60 s. After the timing, two more steps of each of our
trainers are profiled through its own `logging.profile_steps` profiler (top kernels, device idle fraction, host reads
and synchronizations per step), the peer's as a top-kernel table.

`python bench/gpu.py [--configs ...] [--warmup 6] [--window 4] [--rounds 5] [--time-limit 480]`; without CUDA it
prints SKIP and exits 0. `--smoke` runs the same path on CPU with tiny models (2 layers, 64 wide, seq 64, fp32, the
`aot_eager` backend, FP8 through torchao's emulation): it proves the script, its figures are no result and nothing
is written. What a machine without network needs is in docs/training.md ("bench/gpu.py on a machine without
network"); `bench/gpu_slot.sh` is that recipe as a script.
"""

from __future__ import annotations

import argparse
import json
import math
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
    "gpt2_medium_accum1": ("gpt2", "gpt2-medium", 1024, 16, 1, 50257, 50304, 0.42),
    "gpt2_medium_accum4": ("gpt2", "gpt2-medium", 1024, 16, 4, 50257, 50304, 0.48),
    "llama_1b": ("llama", "llama-1b", 2048, 8, 4, 32000, 32000, 0.58),
}
# Configurations whose child also runs our trainer with model.float8 as a third side (same data, same steps).
FP8_CONFIGS = ("llama_1b",)
FP8_SPEEDUP_GOAL = 1.2  # FP8 tokens/s over our bf16 (torchtitan, Megatron: 1.2-1.5x at 1B-class)
FP8_LOSS_GOAL = 1.01  # FP8 held-out loss over bf16's after the same steps on the same data
FIRST_STEP_GOAL_S = 60.0  # the first optimizer step of each configuration, compilation included
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
    for folder in (run_dir, tmp / "ours-fp8"):  # our bf16 trainer's run, and our FP8 trainer's where it runs
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for stage in ("clean", "dedup", "tokenizer", "tokens"):
            (folder / stage).symlink_to(cfg_path.parent / "run" / stage)
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
        "--fp8-recipe",
        a.fp8_recipe,
        "--eval-batches",
        str(a.eval_batches),
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


def _our_trainer(a, extra: list[str], out: str):
    """Our trainer as `python -m pretrain train` sets it up (pretrain.run.train.set_up: loader, engine, callbacks)
    in the run folder `out`; returns (run, progress, one optimizer step)."""
    from pretrain.run import train as T
    from pretrain.run.step import train_step
    from runconfig import load_config

    ov = [
        f"run.output_dir={out}",
        "logging.progress_bar=false",
        "checkpoint.keep_last=1",
        *overrides(a.child, a, a.child_pad),
        *extra,
    ]
    run, progress, _ = T.set_up(load_config(a.child_config, ov))
    meter = T.make_meter(run)
    run.callbacks.start(run, progress)  # the watchdog, the sinks: as the loop starts them
    run.engine.train()
    batches = iter(run.train_loader)
    run.clock.start()

    def step() -> None:
        train_step(run, progress, batches, meter)
        progress.step += 1

    return run, progress, step


def fp8_overrides(a) -> list[str]:
    return [f"model.float8={a.fp8_recipe}", *(["model.float8_emulate=true"] if a.smoke else [])]


def measure(a) -> int:
    """The child: our trainer (its own set-up and step), the peer and, for FP8_CONFIGS, our trainer with
    model.float8, each timed on its first step (compilation included), warmed up, then in alternating windows;
    then the held-out loss of our two trainers after the same steps, and a profile of two more steps of each."""
    import torch
    import torch.distributed as dist

    from pretrain.run.engine import init_distributed
    from pretrain.run.evaluation import evaluate
    from pretrain.run.profiler import StepProfiler
    from pretrain.run.step import rng_isolated
    from runconfig import load_config

    n_steps = a.warmup + a.window * a.rounds + 2
    init_distributed(
        load_config(a.child_config, [f"run.output_dir={a.child_out}", *overrides(a.child, a, a.child_pad)])
    )
    trainers = {"ours": _our_trainer(a, [], a.child_out)}
    if a.child in FP8_CONFIGS:
        trainers["fp8"] = _our_trainer(a, fp8_overrides(a), a.child_out + "-fp8")
    run = trainers["ours"][0]
    cfg, device = run.cfg, run.device.type
    peer = PlainLoop(cfg, n_steps, device)
    sides = {"ours": trainers["ours"][2], "peer": peer.step}
    if "fp8" in trainers:
        sides["fp8"] = trainers["fp8"][2]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    tokens = a.window * run.plan.grad_accum * cfg.batch.micro_batch_size * cfg.packing.seq_len
    first_step_s: dict[str, float] = {}
    for side, step in sides.items():
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        first_step_s[side] = time.perf_counter() - t0
    for _ in range(a.warmup - 1):
        for step in sides.values():
            step()
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(a.rounds):
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:  # the first side swaps every round
            sync()
            t0 = time.perf_counter()
            for _ in range(a.window):
                sides[side]()
            sync()
            rates[side].append(tokens / (time.perf_counter() - t0))
    eval_loss = {}
    for side, (trainer, _, _) in trainers.items():  # the same steps on the same data so far
        with rng_isolated():
            eval_loss[side] = evaluate(trainer.engine, trainer.eval_loader, a.eval_batches, trainer.device)[
                "loss"
            ]
    summaries = {}
    for side, (trainer, progress, step) in trainers.items():
        logs = Path(trainer.cfg.run.root) / "logs"
        first = progress.step + 1
        profiler = StepProfiler((first, first + 2), logs, 0, trainer.device)
        for _ in range(2):
            profiler.begin(progress.step + 1)
            step()
            profiler.end(progress.step)
        summaries[side] = (logs / "profile" / "summary-rank0.txt").read_text()
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            peer.step()
        sync()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    peer_table = prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=70)
    for trainer, progress, _ in trainers.values():
        trainer.callbacks.end(trainer, progress)
    dist.destroy_process_group()
    for side, summary in summaries.items():
        print(
            f"[{a.child}] {'our FP8' if side == 'fp8' else 'our'} trainer's profile, 2 steps:\n{summary}",
            flush=True,
        )
    print(f"[{a.child}] peer profile, 2 steps:\n{peer_table}", flush=True)
    print(
        RESULT + json.dumps({"rates": rates, "first_step_s": first_step_s, "eval_loss": eval_loss}),
        flush=True,
    )
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
    ap.add_argument(
        "--fp8-recipe",
        default="tensorwise",
        choices=["tensorwise", "rowwise"],
        help="model.float8 of the FP8 side (tensorwise: torchao's faster recipe)",
    )
    ap.add_argument(
        "--eval-batches", type=int, default=8, help="held-out micro-batches for the FP8 and bf16 losses"
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
        a.warmup, a.window, a.rounds, a.eval_batches = 1, 1, 2, 2

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
                child = run_child(name, cfg_path, pad, tmp / name, a, env)
            except Exception as e:  # report and go on to the next configuration
                print(f"[{name}] FAILED: {str(e)[-3000:]}", flush=True)
                failed[name] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                continue
            results[name] = (child, fpt)
            rates, first = child["rates"], child["first_step_s"]
            ours, peer = rates["ours"], rates["peer"]
            rep.line(
                f"[{name}] {fpt / 1e9:.3f} GFLOP/token; ours {statistics.median(ours):.0f} tokens/s "
                f"(MFU {statistics.median(ours) * fpt / peak:.1%}), peer {statistics.median(peer):.0f} tokens/s "
                f"(MFU {statistics.median(peer) * fpt / peak:.1%}); first step (compilation included) ours "
                f"{first['ours']:.1f}s, peer {first['peer']:.1f}s; {time.monotonic() - t_cfg:.0f}s"
            )
            if "fp8" in rates:
                loss = child["eval_loss"]
                rep.line(
                    f"[{name}] FP8 ({a.fp8_recipe}) {statistics.median(rates['fp8']):.0f} tokens/s "
                    f"(MFU {statistics.median(rates['fp8']) * fpt / peak:.1%}), first step {first['fp8']:.1f}s; "
                    f"held-out loss after the same steps: FP8 {loss['fp8']:.4f}, bf16 {loss['ours']:.4f}"
                )
    for name, err in failed.items():
        rep.line(f"FAILED {name}: {err}")
    if device == "cpu":  # the smoke run proves the path; its figures are no result
        for name in a.configs:
            sides = results[name][0]["rates"] if name in results else {}
            ran = bool(sides) and all(sides.values()) and ("fp8" in sides) == (name in FP8_CONFIGS)
            rep.line(f"SMOKE {name}: {'ran' if ran else 'FAILED'} ({', '.join(sides) or 'no side'})")
        return 1 if failed or any(not all(r[0]["rates"].values()) for r in results.values()) else 0
    for name in a.configs:
        goal = CONFIGS[name][-1]
        child, fpt = results.get(name, ({}, 0.0))  # a failed configuration fails its VERDICTs
        rates = child.get("rates", {})
        first, loss = child.get("first_step_s", {}), child.get("eval_loss", {})
        ours, peer = rates.get("ours", [0.0]), rates.get("peer", [1.0])
        rep.verdict(f"gpu_mfu_{name}", statistics.median(ours) * fpt / 1e12, peak / 1e12, goal)
        rep.compare(f"gpu_vs_plain_torch_{name}", ours, peer, 1.0, unit="tokens/s")
        # each of our trainers' first step against the bound itself: the plain loop's is printed above
        for side in ("ours", "fp8") if name in FP8_CONFIGS else ("ours",):
            rep.verdict(
                f"gpu_first_step_s_{name}{'_fp8' if side == 'fp8' else ''}",
                first.get(side, math.inf),
                FIRST_STEP_GOAL_S,
                1.0,
                lower_is_better=True,
            )
        if name in FP8_CONFIGS:
            rep.compare(
                f"gpu_fp8_vs_bf16_{name}", rates.get("fp8", [0.0]), ours, FP8_SPEEDUP_GOAL, unit="tokens/s"
            )
            rep.verdict(
                f"gpu_fp8_vs_bf16_heldout_loss_{name}",
                loss.get("fp8", math.inf),
                loss.get("ours", 1.0),
                FP8_LOSS_GOAL,
                lower_is_better=True,
            )
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
