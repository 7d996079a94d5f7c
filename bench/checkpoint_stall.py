"""Checkpoint stall: how much longer the step that saves a checkpoint takes than a normal step, with the save's
finishing part (hashing, COMPLETE, `latest`, pruning, a remote run's upload) in the background
(`checkpoint.async_mode: async`, the default) and before it (`disabled`: all of it before the step goes on).

Data and model: the demo recipe (configs/gpt2-budget.yaml: GPT-2-style 4 x 128, DeepSpeed ZeRO-2, 2 CPU ranks,
gloo, its own batch: 32 sequences of 128 tokens, micro-batches of 16) on a small BBC run prepared by our data stages;
`--steps` steps, a checkpoint every `--every` steps, evaluation off (once at the end), a metrics row every step.
`--global-batch N` runs a smaller step than the recipe's (the checkpoint is the same size, so the ratio is higher:
until 2026-11-29 the bench ran 8). Step time: each row's global batch / samples_per_s
(the trainer's meter spans the time between two rows, so a save at step k lands in row k+1). Stall of a save at step
k: row k+1's time minus the median of the rows that follow no save (the first rows, warm-up, are dropped; the final
save is waited for at the end of the run and is not counted).

Runs: local async (the background thread writes and hashes), local sync; a remote run (`run.output_dir: s3://...`
on a moto S3 server on 127.0.0.1) async without and with an upload delay, and sync with the delay. The delay is a
sleep of `--upload-delay` seconds before each upload, put there from outside the product by the slow-disk test
plug-in (tests/plugins/slow_disk.py, `upload=D`), standing in for a slow network; it must be shorter than the time
between two saves, or the next save waits for the upload by design. (The writer-process arm is gone with the
writer process, issue 65: on CPU it was no better than the thread.)

Rounds: each save is measured against its own run's normal steps (a run's start-up, imports and DeepSpeed, costs
far more than its steps, so a save is the unit, not a run). The local settings run `--rounds` times, alternating
(async, sync, async, ...), and each figure pools the saves of all its runs: a drift of the host's speed
lands on every setting alike, and 72 steps x 3 rounds give 33 saves per setting, where one run of 36 steps, the
default before, gave 5 (even at 33, on 2 busy CPU ranks the thread writer's median moved between 0.07 and 0.11 of a
step over three runs of the same code, docs/results.md). The remote runs, one each, measure whether the stall grows
with the upload's duration. VERDICTs (lower is better; the sync runs, "before", are printed beside them):
- local async stall / normal step <= 0.10 (`local_async`);
- remote async stall with the upload delay / normal step <= 0.10 (independent of the upload's duration);
- growth of the remote async stall when the delay is added, over the delay itself, <= 0.10 (sync grows by ~1).

`python bench/checkpoint_stall.py [--steps 72] [--every 6] [--rounds 3] [--upload-delay 0.5] [--global-batch N]`
(2 x rounds + 3 trainer runs)

`--cpu-ranks 1`: one CPU rank of one thread, so one of this machine's 2 cores is idle during the step, as a GPU
node's host cores are; the same global batch (2 micro-batches per step instead of one per rank). Its results file
and VERDICT names carry `1cpu-rank`.

`--gpu [--preset gpt2-small]`: one CUDA rank (NCCL) instead of 2 CPU ranks, so the background part runs on host
cores the step leaves idle, as on a GPU node; its results file carries a `gpu` suffix. On 2 CPU ranks over 2 cores
no core is idle: the background's writing and hashing take their time from the next step. A larger preset saves
more bytes: keep the time between saves (`--every` steps) longer than the background part, or the next save
waits for it by design.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

EXTRA_YAML = ""
ASYNC_MODE = {"async": "async", "sync": "disabled"}  # checkpoint.async_mode of each arm
WARMUP_ROWS = 3


def _link_stages(cfg_path: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("clean", "dedup", "tokenizer", "tokens"):
        (out / name).symlink_to((cfg_path.parent / "run" / name).resolve())


def recipe_batch(preset: str) -> tuple[int, int]:
    """(global batch, micro-batch) of `configs/<preset>.yaml`: the step the recipe's runs take."""
    from runconfig import load_config

    b = load_config(C.ROOT / "configs" / f"{preset}.yaml").batch
    return b.global_batch_size, b.micro_batch_size


def step_times(metrics: str, global_batch: int) -> dict[int, float]:
    rows = [json.loads(x) for x in metrics.splitlines() if x.strip()]
    return {r["step"]: global_batch / r["samples_per_s"] for r in rows if r["split"] == "train"}


def save_steps(steps: int, every: int) -> list[int]:
    """The steps whose save is measured: every save but the last (waited for at the end of the run)."""
    return list(range(every, steps, every))


def stalls(times: dict[int, float], steps: int, every: int) -> tuple[list[float], float]:
    """(stall of each save but the last, in seconds; median normal step)."""
    saves = save_steps(steps, every)
    after_save = {s + 1 for s in saves}
    normal = statistics.median(t for s, t in times.items() if s > WARMUP_ROWS and s not in after_save)
    return [times[s + 1] - normal for s in saves], normal


def interval_excess(times: dict[int, float], steps: int, every: int, normal: float) -> list[float]:
    """For each save but the last, what its whole interval cost: rows k+1 .. k+every (the save's step and the steps
    its background part may spill into) minus `every` normal steps (the run's median, as for the stall; the row
    before each next save alone, 11 rows at one offset, ran slow in the sync runs). Reported beside the VERDICTs,
    not one: a background part that only moved its cost to the steps after the checkpoint step shows here, not in
    the stall."""
    return [sum(times[s + o] for o in range(1, every + 1)) - every * normal for s in save_steps(steps, every)]


def rank_count(gpu: bool, cpu_ranks: int = 2) -> int:
    """`cpu_ranks` CPU ranks (gloo, one thread each), or with `gpu` one CUDA rank (NCCL): the host's cores free for
    the background save."""
    return 1 if gpu else cpu_ranks


def base_overrides(
    steps: int, every: int, gpu: bool, cpu_ranks: int, global_batch: int, micro_batch: int
) -> list[str]:
    """The settings every run of the bench shares: a save every `every` steps, evaluation only at the end, a
    metrics row per step, `rank_count(gpu, cpu_ranks)` ranks, the same global batch whatever the ranks (micro-batches
    no larger than the recipe's, accumulated)."""
    nproc = rank_count(gpu, cpu_ranks)
    ranks = [f"launch.procs_per_node={nproc}", *(["launch.backend=nccl"] if gpu else [])]
    micro = min(micro_batch, global_batch // nproc)
    return [f"schedule.total_steps={steps}", f"checkpoint.every_steps={every}", "checkpoint.keep_last=2",
            f"eval.every_steps={10 * steps}", "logging.every_steps=1", "logging.plots=false",
            f"batch.global_batch_size={global_batch}", f"batch.micro_batch_size={micro}", *ranks,
            "schedule.budget_minutes=null"]  # fmt: skip


def run(cfg_path: Path, overrides: list[str], env: dict[str, str], nproc: int) -> None:
    res, wall = C.torchrun(nproc, ["-m", "pretrain", "train", "--config", str(cfg_path), *overrides], env=env)
    if res.returncode != 0:
        raise SystemExit(f"trainer failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    print(f"  run of {wall:.0f}s: {' '.join(o for o in overrides if 'async' in o or 'output_dir' in o)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=72)
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs of each local setting")
    ap.add_argument("--every", type=int, default=6, help="checkpoint every N steps")
    # shorter than the time between two saves (6 steps of the recipe: about 4 s on a quiet 2-core machine), or the next save
    # waits for the upload by design and the remote figures measure that wait
    ap.add_argument("--upload-delay", type=float, default=0.5, help="seconds of sleep before each upload")
    ap.add_argument("--gpu", action="store_true", help="one CUDA rank (NCCL) instead of 2 CPU ranks")
    ap.add_argument("--preset", default="gpt2-budget", help="the recipe: a gpt2-* config in configs/")
    ap.add_argument(
        "--global-batch", type=int, default=None, help="sequences per step (default: the recipe's)"
    )
    ap.add_argument(
        "--cpu-ranks",
        type=int,
        default=2,
        choices=(1, 2),
        help="CPU ranks of one thread each: 2 keep both cores busy; 1 leaves a core idle for the background "
        "part, as a GPU node's host does",
    )
    a = ap.parse_args()
    if a.rounds < 1:
        raise SystemExit("--rounds: at least 1")
    if a.gpu and a.cpu_ranks != 2:
        raise SystemExit("--cpu-ranks: CPU ranks only; --gpu runs one CUDA rank")
    if a.gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--gpu: no CUDA device here")
    # where the run holds, said once: the results file's suffix and the VERDICT names' both come from it
    place = "gpu" if a.gpu else "1cpu-rank" if a.cpu_ranks == 1 else None
    recipe_global, micro = recipe_batch(a.preset)
    global_batch = a.global_batch or recipe_global
    batch = None if global_batch == recipe_global else f"batch{global_batch}"
    variant = (
        "-".join(([] if a.preset == "gpt2-budget" else [a.preset]) + [x for x in (place, batch) if x]) or None
    )
    rep = C.Report(__file__, variant=variant)
    nproc = rank_count(a.gpu, a.cpu_ranks)
    rep.line(
        f"recipe {a.preset}, {global_batch} sequences per step"
        + (" (the recipe's)" if batch is None else f" (the recipe's: {recipe_global})")
        + "; "
        + ("1 CUDA rank (NCCL)" if a.gpu else f"{nproc} CPU rank(s) (gloo, 1 thread each)")
    )
    t_start = time.perf_counter()
    base = base_overrides(a.steps, a.every, a.gpu, a.cpu_ranks, global_batch, micro)
    where = "".join("_" + x.replace("-", "_") for x in (place, batch) if x)
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-stall-") as d:
        tmp = Path(d)
        cfg_path = C.prepare_run(tmp / "data", "gpt2", EXTRA_YAML, preset=a.preset, files="0[0-4]?.txt")
        print(f"data stages on BBC: {time.perf_counter() - t_start:.0f}s")
        env = C.child_env(accelerator="cuda" if a.gpu else "cpu")
        # per setting, pooled over the rounds: (stall of each save, the normal step of that save's run, the excess
        # over that save's whole interval)
        figures: dict[str, tuple[list[float], list[float], list[float]]] = {}
        for r in range(a.rounds):
            for mode in ("async", "sync"):
                out = tmp / f"local-{mode}-{r}"
                _link_stages(cfg_path, out)
                over = [*base, f"run.output_dir={out}", f"checkpoint.async_mode={ASYNC_MODE[mode]}"]
                run(cfg_path, over, env, nproc)
                times = step_times((out / "logs" / "metrics.jsonl").read_text(), global_batch)
                st, normal = stalls(times, a.steps, a.every)
                pooled = figures.setdefault(f"local_{mode}", ([], [], []))
                pooled[0].extend(st)
                pooled[1].extend([normal] * len(st))
                pooled[2].extend(interval_excess(times, a.steps, a.every, normal))
                shutil.rmtree(out)  # its checkpoints: the next rounds' disk

        from core.storage import RunStore
        from tests.moto_s3 import moto_server, s3fs_client
        from tests.plugins import slow_disk

        with moto_server() as s3env:
            fs = s3fs_client(s3env)
            fs.mkdir("runs")
            local = (cfg_path.parent / "run" / "tokens").resolve().parent  # the prepared stages (linked)
            for name, mode, delay in (("remote_async_nodelay", "async", 0.0), ("remote_async_delay", "async",
                                      a.upload_delay), ("remote_sync_delay", "sync", a.upload_delay)):  # fmt: skip
                url = f"s3://runs/{name}"
                RunStore(local.resolve(), url).push(
                    [(local / "tokenizer").resolve(), (local / "tokens").resolve()]
                )
                renv = {**env, **s3env}
                renv = slow_disk.env(f"upload={delay}", renv) if delay else renv
                over = [
                    *base,
                    f"run.output_dir={url}",
                    f"run.local_dir={tmp / name}",
                    f"checkpoint.async_mode={ASYNC_MODE[mode]}",
                ]
                run(cfg_path, over, renv, nproc)
                fs.invalidate_cache()
                times = step_times(fs.cat(f"runs/{name}/logs/metrics.jsonl").decode(), global_batch)
                st, normal = stalls(times, a.steps, a.every)
                figures[name] = (st, [normal] * len(st), interval_excess(times, a.steps, a.every, normal))
                assert fs.cat(f"runs/{name}/checkpoints/latest").decode() == f"step{a.steps:08d}"

        for name, (st, normal, _) in figures.items():
            rep.line(f"{name}: normal step median {statistics.median(normal) * 1e3:.0f} ms; stall per save [ms]: "
                     + ", ".join(f"{s * 1e3:.0f}" for s in st))  # fmt: skip
        for name, (st, normal, interval) in figures.items():
            rep.line(f"{name}: the whole interval after a save (rows k+1..k+{a.every} against as many normal steps): "
                     f"excess median {statistics.median(interval) * 1e3:.0f} ms = "
                     f"{statistics.median(interval) / statistics.median(normal):.3f} of a normal step; stall of the "
                     f"checkpoint step alone {statistics.median(st) / statistics.median(normal):.3f}")  # fmt: skip
        rep.line(
            f"upload delay: {a.upload_delay:g} s of sleep before each upload; saves every {a.every} steps"
        )
        for name in (
            "local_sync",
            "remote_sync_delay",
        ):  # before: the figures the async path is measured against
            st, normal, _ = figures[name]
            rep.line(f"before ({name}): stall median {statistics.median(st) * 1e3:.0f} ms = "
                     f"{statistics.median(st) / statistics.median(normal):.2f} of a normal step")  # fmt: skip
        for name in ("local_async", "remote_async_delay"):
            st, normal, _ = figures[name]
            rep.compare(f"checkpoint_stall_{name}_vs_normal_step{where}", st, normal, 0.10,
                        lower_is_better=True, unit="s, stall of the checkpoint step vs the median normal step")  # fmt: skip
        base0 = statistics.median(figures["remote_async_nodelay"][0])
        growth = {n: [s - base0 for s in figures[n][0]] for n in ("remote_async_delay", "remote_sync_delay")}
        rep.line(f"before (remote_sync_delay): the stall grew by {statistics.median(growth['remote_sync_delay']):.2f} s "
                 f"for an upload delay of {a.upload_delay:g} s")  # fmt: skip
        rep.compare(f"checkpoint_stall_remote_async_growth_vs_upload_delay{where}", growth["remote_async_delay"],
                    [a.upload_delay] * len(growth["remote_async_delay"]), 0.10, lower_is_better=True,
                    unit="s, stall minus the no-delay median vs the delay")  # fmt: skip
    print(f"total bench time {time.perf_counter() - t_start:.0f}s")
    return rep.finish()


if __name__ == "__main__":
    raise SystemExit(main())
