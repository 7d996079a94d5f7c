"""Small-model training throughput: our DeepSpeed path on 2 ranks vs the same model in a plain PyTorch loop.

The question (issue 13): on a 2-core machine, does our engine cost a small model much of the speed a plain
single-process loop gets from the same cores? Both sides train the model `pretrain.models.build_model` builds
from the same preset (default `configs/gpt2-budget.yaml`, the demo's recipe), on the same packed BBC samples
(our data stages: clean -> dedup -> tokenizer -> tokenize) drawn through the same `PretrainLoader` and collator,
with the same global batch, micro-batch, AdamW hyper-parameters and gradient clipping.

- ours: `python -m pretrain train` under torchrun, 2 ranks x 1 thread (gloo), DeepSpeed with the preset's ZeRO
  stage; the steady-state rate is read back from its metrics.jsonl (rows after WARMUP steps).
- peer: one process, `loss.backward(); clip; opt.step()`, micro-batches accumulated to the same global batch,
  timed with `perf_counter` over the same step window; run with every thread count in --peer-threads (default:
  all cores, and 1) and credited with its best, so the peer is not handicapped by thread oversubscription on a
  busy machine.

Rounds alternate (ours, peer, ours, ...) to spread this shared machine's noise over both; medians with min/max.
`python bench/small_model_throughput.py [--preset gpt2-budget] [--rounds 5] [--steps 30]`
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

WARMUP = 5


def overrides(steps: int) -> list[str]:
    total = WARMUP + steps
    return [f"schedule.total_steps={total}", "schedule.warmup_steps=1", "schedule.budget_minutes=null",
            "schedule.warmup_fraction=null", f"eval.every_steps={total}", "eval.max_batches=1",
            f"checkpoint.every_steps={total}", "logging.peak_flops=1e11"]


def peer_worker(argv: list[str]) -> None:
    """The plain loop: one process, all cores as intra-op threads, no DeepSpeed, no process group."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    from data_pipeline.layout import RunLayout
    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import build_collator
    from pretrain.models import build_model
    from pretrain.objectives import prepare_model
    from runconfig import load_config

    torch.set_num_threads(a.threads)
    cfg = load_config(a.config, a.overrides)
    torch.manual_seed(cfg.run.seed)
    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    model = build_model(cfg.model, tok, cfg.packing.seq_len)
    prepare_model(cfg, model)
    model.train()
    loader = PretrainLoader(cfg, 0, 1, split="train", collate_fn=build_collator(cfg, tok))
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    accum = cfg.batch_plan(1)["grad_accum"]
    total = cfg.schedule.steps
    batches = iter(loader)
    tokens, t0 = 0, None
    for step in range(total):
        if step == WARMUP:
            t0, tokens = time.perf_counter(), 0
        for _ in range(accum):
            b = next(batches)
            tokens += int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
            (model(**b).loss / accum).backward()
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    secs = time.perf_counter() - t0
    Path(a.out).write_text(json.dumps({"tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs}))


def run_peer(cfg_path: Path, work: Path, ov: list[str], threads: int) -> dict[str, float]:
    out = work / "peer.json"
    out.unlink(missing_ok=True)
    env = C.child_env(threads=threads)
    ov = [f"run.output_dir={cfg_path.parent / 'run'}", *ov]
    C.run_cmd([sys.executable, str(Path(__file__).resolve()), "peer", "--config", str(cfg_path), "--out", str(out),
               "--threads", str(threads), *ov], timeout=900, env=env)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt2-budget", help="configs/<preset>.yaml (the model and batch)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="timed optimizer steps per run (after warm-up)")
    ap.add_argument("--set", nargs="*", default=[], help="extra overrides for both sides (k=v)")
    ap.add_argument("--peer-threads", default=None, help="comma-separated thread counts for the peer (default: cores,1)")
    a = ap.parse_args()
    family = a.preset.split("-")[0]
    cores = len(os.sched_getaffinity(0))
    threads = [int(x) for x in a.peer_threads.split(",")] if a.peer_threads else sorted({cores, 1}, reverse=True)
    t_start = time.perf_counter()
    rep = C.Report(__file__)
    with tempfile.TemporaryDirectory(prefix="bench-small-") as d:
        tmp = Path(d)
        cfg_path = C.prepare_run(tmp / "data", family, preset=a.preset)
        rep.line(f"data stages on BBC: {time.perf_counter() - t_start:.0f}s; preset {a.preset}; {cores} cores; "
                 f"ours: 2 ranks x 1 thread; plain loop: best of {threads} thread(s) per round")
        ov = [*overrides(a.steps), *a.set]

        def ours() -> float:
            o = C.run_ours(cfg_path, tmp / "work", [*ov, "launch.procs_per_node=2"], WARMUP)
            rep.line(f"  ours {o['tokens_per_s']:.0f} tokens/s (loader wait {o['loader_wait_frac']:.1%})")
            return o["tokens_per_s"]

        def peer() -> float:
            tried = {n: run_peer(cfg_path, tmp / "work", ov, threads=n)["tokens_per_s"] for n in threads}
            rep.line("  plain loop " + ", ".join(f"{v:.0f} tokens/s with {n} thread(s)" for n, v in tried.items()))
            return max(tried.values())

        o, p = C.alternate(ours, peer, a.rounds)
    rep.line(f"total bench time {time.perf_counter() - t_start:.0f}s ({a.rounds} alternating rounds, {a.steps} "
             "steps each)")
    rep.compare("small_model_tokens_per_s_vs_plain_loop", o, p, goal=0.8, unit="tokens/s")
    sys.exit(rep.finish())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        peer_worker(sys.argv[2:])
    else:
        main()
