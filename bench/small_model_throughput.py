"""Small-model training throughput, every registered family: our DeepSpeed path on 2 ranks vs the same model in a
plain PyTorch loop.

The question (issues 13 and 27): on a 2-core machine, does our engine cost a small model much of the speed a plain
single-process loop gets from the same cores, for every family? The families are read from the family registry
(`pretrain.families.family_names()`, plug-ins included; no list is kept here); each is measured on its budget
preset: the spec's `bench_preset` attribute where a family names one, else `configs/<family>-budget.yaml`. A
family with neither is reported as a named skip and fails the run. Both sides train the model
`pretrain.run.models.build_model` builds from the preset, with the objective's model settings (`prepare_model`: sparse
prediction) and module (`wrap_model`: ELECTRA's generator + discriminator), on the same packed BBC samples (our
data stages: clean -> dedup -> tokenizer -> tokenize) drawn through the same `PretrainLoader` and collator (MLM,
span corruption or replaced-token detection, as the preset says), with the same global batch, micro-batch,
optimizer (the preset's `optim.name`: AdamW, or transformers' Adafactor for t5-budget) with its hyper-parameters,
and gradient clipping. A run of some families (`--families`, `--preset`) writes
`bench/results/small_model_throughput-<families>.txt`, leaving the full run's file as it is.

- ours: `python -m pretrain train` under torchrun, 2 ranks x 1 thread (gloo), DeepSpeed with the preset's ZeRO
  stage; the steady-state time is read back from its metrics.jsonl (rows after the warm-up steps).
- peer: one process, `loss.backward(); clip; opt.step()`, micro-batches accumulated to the same global batch,
  timed with `perf_counter` over the same step window; run with every thread count in --peer-threads (default:
  all cores, and 1) and credited with its best, so the peer is not handicapped by thread oversubscription on a
  busy machine.
- tokens: both sides train on the same samples in the same step window, counted once the same way
  (`_common.consumed_tokens`: non-pad tokens of the packed samples, i.e. the raw stream tokens; for T5 that is the
  uncorrupted block, longer than the encoder input).

Rounds alternate (ours, peer, ours, ...) to spread this shared machine's noise over both; medians with min/max.
One VERDICT per family: `small_model_throughput_<family>`, goal >= 0.8x.
`python bench/small_model_throughput.py [--families t5 modernbert] [--rounds 5] [--steps 30] [--quick]`
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
QUICK = {"rounds": 1, "steps": 3, "warmup": 2, "files": "0[0-4]?.txt"}  # 50 articles per topic


def overrides(steps: int, warmup: int = WARMUP) -> list[str]:
    total = warmup + steps
    return [
        f"schedule.total_steps={total}",
        "schedule.warmup_steps=1",
        "schedule.budget_minutes=null",
        "schedule.warmup_fraction=null",
        f"eval.every_steps={total}",
        "eval.max_batches=1",
        f"checkpoint.every_steps={total}",
        "logging.peak_flops=1e11",
    ]


def family_presets(only: list[str] | None = None) -> tuple[dict[str, str], list[str]]:
    """{family: preset} for every registered family (or those in `only`), and the skip lines of families that
    have no budget preset (named, so a plug-in family without one is seen, not silently left out)."""
    from pretrain.families import family_names, get_family

    names = family_names()
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise SystemExit(
                f"--families: {', '.join(unknown)} not registered (registered: {', '.join(names)})"
            )
        names = [n for n in names if n in only]
    presets, skips = {}, []
    for name in names:
        preset = getattr(get_family(name), "bench_preset", None) or f"{name}-budget"
        if (C.ROOT / "configs" / f"{preset}.yaml").is_file():
            presets[name] = preset
        else:
            skips.append(
                f"SKIP small_model_throughput_{name}: no configs/{preset}.yaml (family spec names no "
                "bench_preset)"
            )
    return presets, skips


def peer_worker(argv: list[str]) -> None:
    """The plain loop: one process, `--threads` intra-op threads, no DeepSpeed, no process group. Writes the
    seconds of the steps after the warm-up (tokens are counted by the parent, the same way for both sides)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import build_collator
    from pretrain.objectives import prepare_model, wrap_model
    from pretrain.run.models import build_model
    from runconfig import load_config

    torch.set_num_threads(a.threads)
    cfg = load_config(a.config, a.overrides)
    torch.manual_seed(cfg.run.seed)
    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    model = build_model(cfg.model, tok, cfg.packing.seq_len)
    prepare_model(cfg, model)
    model = wrap_model(cfg, model, tok)  # what our trainer trains (ELECTRA: generator + discriminator)
    model.train()
    loader = PretrainLoader(cfg, 0, 1, split="train", collate_fn=build_collator(cfg, tok))
    o = cfg.optim
    # t5-budget: the same optimizer as ours (pretrain/run/engine.py), set up as transformers' docs do for T5
    if o.name == "adafactor":
        from transformers.optimization import Adafactor

        opt = Adafactor(
            model.parameters(),
            lr=o.lr,
            scale_parameter=True,
            relative_step=False,
            warmup_init=False,
            weight_decay=o.weight_decay,
        )
    else:
        opt = torch.optim.AdamW(
            model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
    accum = cfg.batch_plan(1)["grad_accum"]
    total = cfg.schedule.steps
    batches = iter(loader)
    t0 = None
    for step in range(total):
        if step == a.warmup:
            t0 = time.perf_counter()
        for _ in range(accum):
            (model(**next(batches)).loss / accum).backward()
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    secs = time.perf_counter() - t0
    Path(a.out).write_text(json.dumps({"seconds": secs, "steps": total - a.warmup}))


def run_peer(cfg_path: Path, work: Path, ov: list[str], threads: int, warmup: int) -> dict[str, float]:
    out = work / "peer.json"
    work.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    env = C.child_env(threads=threads)
    ov = [f"run.output_dir={cfg_path.parent / 'run'}", *ov]
    C.run_cmd(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "peer",
            "--config",
            str(cfg_path),
            "--out",
            str(out),
            "--threads",
            str(threads),
            "--warmup",
            str(warmup),
            *ov,
        ],
        timeout=900,
        env=env,
    )
    return json.loads(out.read_text())


def bench_family(
    rep: C.Report,
    tmp: Path,
    family: str,
    preset: str,
    a: argparse.Namespace,
    threads: list[int],
    cleaned_from: Path | None,
) -> tuple[list[float], list[float], Path]:
    """Alternating rounds for one family; returns (ours, peer) tokens/s per round and the prepared folder."""
    from runconfig import load_config

    t0 = time.perf_counter()
    folder = tmp / family
    cfg_path = C.prepare_run(folder / "data", family, preset=preset, cleaned_from=cleaned_from, files=a.files)
    ov = [*overrides(a.steps, a.warmup), *a.set]
    total = a.warmup + a.steps
    # Both sides train the same samples in the same window: one count serves every round of both.
    tokens = C.consumed_tokens(
        cfg_path, [f"run.output_dir={cfg_path.parent / 'run'}", *ov], a.warmup + 1, total
    )
    optimizer = load_config(cfg_path, [f"run.output_dir={cfg_path.parent / 'run'}", *ov]).optim.name
    rep.line(
        f"{family} ({preset}): data stages {time.perf_counter() - t0:.0f}s; {tokens} tokens in steps "
        f"{a.warmup + 1}..{total}; optimizer {optimizer} on both sides"
    )

    def ours() -> float:
        o = C.run_ours(cfg_path, folder / "work", [*ov, "launch.procs_per_node=2"], a.warmup)
        rep.line(f"  ours {o['tokens_per_s']:.0f} tokens/s (loader wait {o['loader_wait_frac']:.1%})")
        return o["tokens_per_s"]

    def peer() -> float:
        tried = {n: tokens / run_peer(cfg_path, folder / "work", ov, n, a.warmup)["seconds"] for n in threads}
        rep.line(
            "  plain loop " + ", ".join(f"{v:.0f} tokens/s with {n} thread(s)" for n, v in tried.items())
        )
        return max(tried.values())

    o, p = C.alternate(ours, peer, a.rounds)
    return o, p, folder / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="*", default=None, help="registered family names (default: all)")
    ap.add_argument(
        "--preset", default=None, help="one configs/<preset>.yaml instead of the families' budget presets"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="timed optimizer steps per run (after warm-up)")
    ap.add_argument(
        "--warmup", type=int, default=WARMUP, help="untimed optimizer steps at the start of each run"
    )
    ap.add_argument("--files", default=None, help="glob of BBC articles per topic folder (default: all)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK['rounds']} round, {QUICK['steps']} steps, a small corpus; not saved",
    )
    ap.add_argument("--set", nargs="*", default=[], help="extra overrides for both sides (k=v)")
    ap.add_argument(
        "--peer-threads", default=None, help="comma-separated thread counts for the peer (default: cores,1)"
    )
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.steps, a.warmup = QUICK["rounds"], QUICK["steps"], QUICK["warmup"]
        a.files = a.files or QUICK["files"]
    if a.preset:
        presets, skips = {a.preset.split("-")[0]: a.preset}, []
    else:
        presets, skips = family_presets(a.families)
    cores = len(os.sched_getaffinity(0))
    threads = (
        [int(x) for x in a.peer_threads.split(",")] if a.peer_threads else sorted({cores, 1}, reverse=True)
    )
    t_start = time.perf_counter()
    partial = bool(a.families or a.preset)
    rep = C.Report(__file__, variant="-".join(sorted(presets)) if partial else None)
    rep.line(
        f"families {', '.join(presets)}; {cores} cores; ours: 2 ranks x 1 thread; plain loop: best of "
        f"{threads} thread(s) per round; {a.rounds} alternating rounds of {a.steps} timed steps after "
        f"{a.warmup} warm-up steps{f'; BBC articles {a.files}' if a.files else ''}"
    )
    for s in skips:
        rep.line(s)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-small-") as d:
        cleaned = None
        for family, preset in presets.items():
            o, p, folder = bench_family(rep, Path(d), family, preset, a, threads, cleaned)
            cleaned = cleaned or folder  # clean + dedup do not depend on the family: run them once
            results[family] = (o, p)
    rep.line(f"total bench time {time.perf_counter() - t_start:.0f}s")
    for family, (o, p) in results.items():
        rep.compare(f"small_model_throughput_{family}", o, p, goal=0.8, unit="tokens/s")
    code = rep.finish()
    if skips:
        print(
            f"{len(skips)} famil{'y' if len(skips) == 1 else 'ies'} skipped (no budget preset): "
            + ", ".join(s.split(":")[0].removeprefix("SKIP small_model_throughput_") for s in skips)
        )
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "peer":
        peer_worker(sys.argv[2:])
    else:
        main()
