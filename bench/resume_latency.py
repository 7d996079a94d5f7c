"""Resume latency: time from "load state" to "first batch in hand", resuming early vs late in training.

Data: the BBC News corpus through our data stages (clean -> dedup -> BPE 8000 -> tokenize, FULL-SENTENCES blocks of
128) in a temporary run. Geometry: micro-batch 4 on 1 rank (global batch 4), so one epoch is about 2,100 steps:
step 10 and step 1,000 lie inside epoch 0, step 100,000 in a much later epoch (the loader is endless).

1. Our loader (`PretrainLoader`, the product's MLM collator, 1 DataLoader worker as configured by default): a fresh
   loader per trial (construction, i.e. opening the memory-mapped shards, is timed separately: it does not depend
   on the position); timed = `load_state_dict(state at step N)` + `iter()` + `next()` (worker start-up included).
   The state is what a checkpoint carries (`state_dict()` of a loader that consumed N steps). Median of TRIALS.
   Correctness: the first resumed batch must hold the same sample ids as batch N of an uninterrupted pass
   (checked by replaying N batches of sample ids for N = 10 and 1,000).
2. Baselines, over the same packed samples, same collator, batch size and worker count, through accelerate's
   `skip_first_batches` exactly as the HF Trainer resumes:
   - map-style dataset (HF Trainer + `datasets` in memory): `SkipBatchSampler` regenerates and drops the index
     lists of the first (N mod steps-per-epoch) batches of the current epoch; no samples are read for them.
   - iterable dataset (HF `datasets` streaming, webdataset-style shards): the Trainer cannot know the epoch
     length and skips all N batches; accelerate's `SkipDataLoader` reads and collates every one of them.
     At 100,000 steps this replay is run only if the measured per-batch rate predicts under a minute; otherwise
     the time is extrapolated from the 10,000-step measurement (and printed as such).
3. The whole trainer (`torchrun -m pretrain train`, 2 ranks, tiny RoBERTa): a 2-step run's checkpoint is cloned as
   the checkpoint of step N (client state step/tokens/loader position and DeepSpeed's step counters rewritten,
   weights and optimizer state as saved), and the trainer restarts from it for one step; RESTART_ROUNDS rounds,
   interleaved over N, medians. Reported: wall time of the restart and the trainer's own first-batch wait
   (loader_wait_frac x interval of its first metrics row: from the first `next()` on the loader to the batch).

`python bench/resume_latency.py [--no-trainer]`  (about 4-5 minutes here)
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

STEPS = (10, 1_000, 100_000)
TRIALS = 9
RESTART_ROUNDS = 2
EXTRA_YAML = "tokenizer: {vocab_size: 8000}\npacking: {seq_len: 128}\n"
LOADER_OV = ["batch.micro_batch_size=4", "batch.global_batch_size=4", "launch.procs_per_node=1"]


def sample_ids(samples: list[dict]) -> list[int]:
    return [int(s["sample_id"]) for s in samples]


def our_loader(cfg_path: Path) -> dict:
    from transformers import AutoTokenizer

    from data_pipeline.layout import RunLayout
    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import build_collator
    from runconfig import load_config

    cfg = load_config(cfg_path, LOADER_OV)
    collate = build_collator(cfg, AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer)))
    t0 = time.perf_counter()
    probe = PretrainLoader(cfg, 0, 1, collate_fn=collate)
    build_s = time.perf_counter() - t0
    steps_per_epoch = probe.num_samples // probe.global_batch
    print(f"our loader: {probe.num_samples} train samples/epoch, {steps_per_epoch} steps/epoch at global batch "
          f"{probe.global_batch}; construction {build_s * 1e3:.0f} ms (position-independent, not in the timings)")  # fmt: skip

    # correctness: the resumed first batch is batch N of an uninterrupted pass
    for n in STEPS[:2]:
        ref = PretrainLoader(cfg, 0, 1, collate_fn=sample_ids)
        it = iter(ref)
        for _ in range(n):
            next(it)
        expected = next(it)
        donor = PretrainLoader(cfg, 0, 1, collate_fn=sample_ids)
        donor.consumed = n * donor.global_batch
        res = PretrainLoader(cfg, 0, 1, collate_fn=sample_ids)
        res.load_state_dict(donor.state_dict())
        got = next(iter(res))
        if got != expected:
            raise AssertionError(f"resume at step {n}: first batch {got} != uninterrupted batch {expected}")
    print("correctness: resumed first batch == batch N of an uninterrupted pass, for N = 10 and 1000")

    out = {"steps_per_epoch": steps_per_epoch, "build_s": build_s, "ms": {}}
    states = {}
    for n in STEPS:
        donor = PretrainLoader(cfg, 0, 1, collate_fn=collate)
        donor.consumed = n * donor.global_batch
        states[n] = donor.state_dict()
    times: dict[int, list[float]] = {n: [] for n in STEPS}
    for _ in range(TRIALS):  # interleaved over N: load changes on this shared machine hit every N alike
        for n in STEPS:
            ld = PretrainLoader(cfg, 0, 1, collate_fn=collate)
            t0 = time.perf_counter()
            ld.load_state_dict(states[n])
            batch = next(iter(ld))
            times[n].append(time.perf_counter() - t0)
            assert batch["input_ids"].shape == (4, 128)
    for n in STEPS:
        out["ms"][n] = statistics.median(times[n]) * 1e3
        print(f"  ours, resume at step {n:>7} (epoch {states[n]['epoch']}): load_state_dict -> first batch "
              f"{out['ms'][n]:.1f} ms (median of {TRIALS}: {', '.join(f'{t * 1e3:.0f}' for t in times[n])})")  # fmt: skip
    return out


def baselines(cfg_path: Path, steps_per_epoch: int) -> dict:
    """accelerate's skip_first_batches over our packed samples: map-style (sampler skip) and iterable (replay)."""
    import numpy as np
    import torch
    from accelerate import PartialState, skip_first_batches
    from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler
    from transformers import AutoTokenizer

    from data_pipeline.layout import RunLayout
    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import build_collator
    from runconfig import load_config

    PartialState(cpu=True)
    cfg = load_config(cfg_path, LOADER_OV)
    collate = build_collator(cfg, AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer)))
    ld = PretrainLoader(cfg, 0, 1, collate_fn=collate)
    src, idx, _ = ld.epoch_order(0)
    sources = ld.sources

    def item(i: int) -> dict:
        out = sources[int(src[i])][int(idx[i])]
        out["sample_id"] = np.int64(i)
        out["epoch"] = 0
        return out

    class MapStyle(Dataset):
        def __len__(self) -> int:
            return len(idx)

        def __getitem__(self, i: int) -> dict:
            return item(i)

    class Streaming(IterableDataset):
        def __iter__(self):
            epoch = 0
            while True:  # endless, reshuffled per epoch, like a streaming dataset with .shuffle(seed) and repeats
                for i in np.random.default_rng([cfg.run.seed, epoch]).permutation(len(idx)):
                    yield item(int(i))
                epoch += 1

    kw = {"batch_size": 4, "collate_fn": collate, "num_workers": cfg.loader.num_workers}
    out: dict = {"map_ms": {}, "replay_ms": {}, "replay_extrapolated": set()}
    ds = MapStyle()
    times: dict[int, list[float]] = {n: [] for n in STEPS}
    for _ in range(TRIALS):
        for n in STEPS:
            skip = n % steps_per_epoch  # HF Trainer: epochs_trained = step // per_epoch, skip the rest in this epoch
            dl = DataLoader(ds, sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(0)), **kw)
            t0 = time.perf_counter()
            next(iter(skip_first_batches(dl, skip)))
            times[n].append(time.perf_counter() - t0)
    for n in STEPS:
        out["map_ms"][n] = statistics.median(times[n]) * 1e3
        print(f"  HF map-style skip_first_batches at step {n:>7} (skips {n % steps_per_epoch} index batches): "
              f"{out['map_ms'][n]:.1f} ms (median of {TRIALS})")  # fmt: skip
    rate = None
    for n in (10, 1_000, 10_000, 100_000):
        if n == 100_000 and rate is not None and rate * n > 60:
            out["replay_ms"][n] = rate * n * 1e3
            out["replay_extrapolated"].add(n)
            print(f"  replay (streaming, SkipDataLoader) at step {n:>7}: {rate * n:.0f} s EXTRAPOLATED from the "
                  f"10,000-step run ({rate * 1e3:.2f} ms/batch)")  # fmt: skip
            continue
        dl = DataLoader(Streaming(), **kw)
        t0 = time.perf_counter()
        next(iter(skip_first_batches(dl, n)))
        dt = time.perf_counter() - t0
        out["replay_ms"][n] = dt * 1e3
        if n >= 1_000:
            rate = dt / n
        print(f"  replay (streaming, SkipDataLoader) at step {n:>7}: {dt * 1e3:.0f} ms")
    return out


def _link_stages(cfg_path: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (out / stage).symlink_to(cfg_path.parent / "run" / stage)


def trainer_restart(tmp: Path, cfg_path: Path) -> dict[int, dict[str, float]]:
    """Clone a real step-2 checkpoint as step N and time the trainer's restart + one step (tiny RoBERTa of
    configs/roberta-tiny.yaml on the same token shards)."""
    import torch

    base_ov = ["batch.micro_batch_size=4", "batch.global_batch_size=8", "logging.every_steps=1",
               "logging.progress_bar=false", "logging.peak_flops=1.0e+10", "eval.max_batches=1",
               "checkpoint.keep_last=1", "loader.eval_fraction=0.02"]  # fmt: skip
    seed_dir = tmp / "seed"
    _link_stages(cfg_path, seed_dir)
    C.torchrun(2, ["-m", "pretrain", "train", "--config", str(cfg_path), *base_ov, f"run.output_dir={seed_dir}",
                   f"checkpoint.dir={seed_dir}/ckpt", "schedule.total_steps=2", "schedule.warmup_steps=1",
                   "checkpoint.every_steps=2", "eval.every_steps=2"])  # fmt: skip
    src = seed_dir / "ckpt" / "step00000002"

    def clone_as(n: int, ck: Path) -> str:
        tag = f"step{n:08d}"
        shutil.copytree(src, ck / tag)
        for f in (ck / tag).glob("mp_rank_*_model_states.pt"):
            st = torch.load(f, weights_only=False)
            g = st["loader"]["global_batch_size"]
            st["loader"] = {**st["loader"], "consumed_samples": n * g,
                            "epoch": n * g // st["loader"]["samples_per_epoch"]}  # fmt: skip
            st.update(step=n, tokens_seen=n * g * 128, global_steps=n, global_samples=n * g)
            torch.save(st, f)
        meta = json.loads((ck / tag / "COMPLETE").read_text())
        (ck / tag / "COMPLETE").write_text(json.dumps({**meta, "step": n}))
        (ck / "latest").write_text(tag)
        return tag

    runs: dict[int, list[dict[str, float]]] = {n: [] for n in STEPS}
    for r in range(RESTART_ROUNDS):  # interleaved: 10, 1000, 100000, 10, ... so machine noise hits all alike
        for n in STEPS:
            ck, out = tmp / f"ck{n}-{r}", tmp / f"restart{n}-{r}"
            tag = clone_as(n, ck)
            _link_stages(cfg_path, out)
            res, wall = C.torchrun(2, ["-m", "pretrain", "train", "--config", str(cfg_path), *base_ov,
                                       f"run.output_dir={out}", f"checkpoint.dir={ck}",
                                       f"schedule.total_steps={n + 1}", "schedule.warmup_steps=1",
                                       f"checkpoint.every_steps={n + 1}", f"eval.every_steps={n + 1}"])  # fmt: skip
            if f"resumed from {ck / tag} at step {n}" not in res.stdout:
                raise AssertionError(f"trainer did not resume at step {n}:\n{res.stdout[-2000:]}")
            row = next(json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()
                       if json.loads(line).get("split") == "train")  # fmt: skip
            interval = (row["tokens_seen"] - n * 8 * 128) / row["tokens_per_s"]
            runs[n].append({"wall_s": wall, "first_batch_wait_ms": row["loader_wait_frac"] * interval * 1e3})
            print(f"  trainer restart at step {n:>7}: wall {wall:.1f} s (imports, DeepSpeed init, checkpoint load, "
                  f"one step, final save); first-batch wait {runs[n][-1]['first_batch_wait_ms']:.0f} ms; "
                  f"first logged step {row['step']}")  # fmt: skip
            shutil.rmtree(ck, ignore_errors=True)
    results = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in runs.items()}
    for n, v in results.items():
        print(f"  trainer restart at step {n:>7}, medians of {RESTART_ROUNDS}: wall {v['wall_s']:.1f} s, "
              f"first-batch wait {v['first_batch_wait_ms']:.0f} ms")  # fmt: skip
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-trainer", action="store_true", help="skip the whole-trainer restart part")
    a = ap.parse_args()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as d:
        tmp = Path(d)
        cfg_path = C.prepare_run(tmp / "data", "roberta", EXTRA_YAML)
        print(f"data stages on BBC: {time.perf_counter() - t_start:.0f}s")
        ours = our_loader(cfg_path)
        base = baselines(cfg_path, ours["steps_per_epoch"])
        tr = None if a.no_trainer else trainer_restart(tmp, cfg_path)
    print(f"total bench time {time.perf_counter() - t_start:.0f}s")
    o = ours["ms"]
    for n in STEPS[1:]:
        r = o[n] / o[10]
        print(f"VERDICT resume_latency_loader_step{n}_vs_step10_lower_is_better: ours={o[n]:.1f}ms peer={o[10]:.1f}ms "
              f"ratio={r:.2f} goal=1.5 {'pass' if r <= 1.5 else 'fail'}")  # fmt: skip
    for n in STEPS[1:]:
        rep = base["replay_ms"][n]
        r = o[n] / rep
        tag = "_extrapolated" if n in base["replay_extrapolated"] else ""
        print(f"VERDICT resume_latency_step{n}_vs_replay{tag}_lower_is_better: ours={o[n]:.1f}ms peer={rep:.0f}ms "
              f"ratio={r:.4f} goal=1 {'pass' if r <= 1 else 'fail'}")  # fmt: skip
    if tr is not None:
        w = {n: tr[n]["first_batch_wait_ms"] for n in STEPS}
        r = w[100_000] / w[10]
        print(f"VERDICT resume_latency_trainer_first_batch_step100000_vs_step10_lower_is_better: "
              f"ours={w[100_000]:.0f}ms peer={w[10]:.0f}ms ratio={r:.2f} goal=1.5 {'pass' if r <= 1.5 else 'fail'}")  # fmt: skip
        r = tr[100_000]["wall_s"] / tr[10]["wall_s"]
        print(f"VERDICT resume_latency_trainer_step100000_vs_step10_lower_is_better: ours={tr[100_000]['wall_s']:.1f}s "
              f"peer={tr[10]['wall_s']:.1f}s ratio={r:.2f} goal=1.5 {'pass' if r <= 1.5 else 'fail'}")  # fmt: skip


if __name__ == "__main__":
    main()
