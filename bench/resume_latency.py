"""Resume latency: time from "load state" to "first batch in hand", resuming early vs late in training.

Data: the BBC News corpus through our data stages (clean -> dedup -> BPE 8000 -> tokenize, FULL-SENTENCES blocks of
128) in a temporary run. Geometry: micro-batch 4 on 1 rank (global batch 4), so one epoch is about 2,000 steps:
step 10 and step 1,000 lie inside epoch 0, step 100,000 in a much later epoch (the loader is endless).

1. Loader. Ours: `PretrainLoader` with the product's MLM collator and 1 DataLoader worker (the default); timed =
   `load_state_dict(state at step N)` + `iter()` + `next()` on a fresh loader (construction, i.e. opening the
   memory-mapped shards, does not depend on N and is timed separately). Peer: what the HF Trainer does on resume,
   accelerate's `skip_first_batches` on a map-style DataLoader over the very same packed samples, same collator,
   batch size and worker count: `SkipBatchSampler` drops the index lists of the first (N mod steps-per-epoch)
   batches of the current epoch; timed = `skip_first_batches(dl, N mod steps)` + `iter()` + `next()`. Both measured
   at every N (no extrapolation), `--rounds` rounds, each round alternating ours and the peer at every N.
   Correctness: the first resumed batch must hold the same sample ids as batch N of an uninterrupted pass
   (checked by replaying N batches of sample ids for N = 10 and 1,000).
2. Trainer (`torchrun -m pretrain train`, 2 ranks, tiny RoBERTa): a 2-step run's checkpoint is cloned as the
   checkpoint of step N (client state step/tokens/loader position and DeepSpeed's step counters rewritten, weights
   and optimizer state as saved) and the trainer restarts from it for one step, `--restart-rounds` rounds
   interleaved over N. Figure: the trainer's own `resume_first_batch_s` (first metrics row after a resume): the
   loader's `load_state_dict` + `iter()` + the wait for the first batch, the same span as part 1 (until
   2026-11-23 it was only the wait after `iter()`, and 5 rounds: a ~30 ms figure whose round-to-round spread of
   +-40 % could not resolve the 10 % flatness bound, so now 9 rounds like the loader). Its peer is the HF map-style
   `skip_first_batches` at the same N, measured in this process right after each restart (not inside an HF
   Trainer process, which would also load its model and engine first).
VERDICTs (lower is better): ours <= peer at every N (goal 1) and flat: step 100,000 / step 10 <= 1.1, for the
loader and for the trainer, each the median of per-round ratios (bench/_common.Report).

`python bench/resume_latency.py [--rounds 9] [--restart-rounds 9] [--no-trainer]`  (about 13 minutes here)
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
EXTRA_YAML = "tokenizer: {vocab_size: 8000}\npacking: {seq_len: 128}\n"
LOADER_OV = ["batch.micro_batch_size=4", "batch.global_batch_size=4", "launch.procs_per_node=1"]


def sample_ids(samples: list[dict]) -> list[int]:
    return [int(s["sample_id"]) for s in samples]


class Loaders:
    """Both sides of the loader measurement over the same packed samples and collator."""

    def __init__(self, cfg_path: Path) -> None:
        import numpy as np
        from accelerate import PartialState
        from torch.utils.data import Dataset
        from transformers import AutoTokenizer

        from core.run_layout import RunLayout
        from data_pipeline.loader import PretrainLoader
        from data_pipeline.objectives import build_collator
        from runconfig import load_config

        PartialState(cpu=True)
        self.cfg = cfg = load_config(cfg_path, LOADER_OV)
        self.collate = build_collator(cfg, AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer)))
        t0 = time.perf_counter()
        probe = PretrainLoader(cfg, 0, 1, collate_fn=self.collate)
        self.build_s = time.perf_counter() - t0
        self.steps_per_epoch = probe.num_samples // probe.global_batch
        self.states = {}
        for n in STEPS:
            probe.consumed = n * probe.global_batch
            self.states[n] = probe.state_dict()
        src, idx, _ = probe.epoch_order(0)
        sources = probe.sources

        class MapStyle(Dataset):  # HF Trainer + an in-memory `datasets` table: a map-style dataset
            def __len__(self) -> int:
                return len(idx)

            def __getitem__(self, i: int) -> dict:
                out = sources[int(src[i])][int(idx[i])]
                out["sample_id"] = np.int64(i)
                out["epoch"] = 0
                return out

        self.dataset = MapStyle()
        self.num_samples = probe.num_samples

    def check(self) -> None:
        """The resumed first batch is batch N of an uninterrupted pass."""
        from data_pipeline.loader import PretrainLoader

        for n in STEPS[:2]:
            ref = PretrainLoader(self.cfg, 0, 1, collate_fn=sample_ids)
            it = iter(ref)
            for _ in range(n):
                next(it)
            expected = next(it)
            res = PretrainLoader(self.cfg, 0, 1, collate_fn=sample_ids)
            res.load_state_dict(self.states[n])
            got = next(iter(res))
            if got != expected:
                raise AssertionError(
                    f"resume at step {n}: first batch {got} != uninterrupted batch {expected}"
                )

    def ours_ms(self, n: int) -> float:
        from data_pipeline.loader import PretrainLoader

        ld = PretrainLoader(self.cfg, 0, 1, collate_fn=self.collate)
        t0 = time.perf_counter()
        ld.load_state_dict(self.states[n])
        batch = next(iter(ld))
        dt = time.perf_counter() - t0
        assert batch["input_ids"].shape == (4, 128)
        return dt * 1e3

    def peer_ms(self, n: int) -> float:
        import torch
        from accelerate import skip_first_batches
        from torch.utils.data import DataLoader, RandomSampler

        dl = DataLoader(self.dataset, sampler=RandomSampler(self.dataset, generator=torch.Generator().manual_seed(0)),
                        batch_size=4, collate_fn=self.collate, num_workers=self.cfg.loader.num_workers)  # fmt: skip
        # HF Trainer: epochs_trained = step // per_epoch, skip the rest of this one
        skip = n % self.steps_per_epoch
        t0 = time.perf_counter()
        batch = next(iter(skip_first_batches(dl, skip)))
        dt = time.perf_counter() - t0
        assert batch["input_ids"].shape == (4, 128)
        return dt * 1e3


def _link_stages(cfg_path: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (out / stage).symlink_to(cfg_path.parent / "run" / stage)


def trainer_restart(
    tmp: Path, cfg_path: Path, loaders: Loaders, rounds: int
) -> dict[str, dict[int, list[float]]]:
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
        from pretrain.checkpoint.writer import file_entries

        tag = f"step{n:08d}"
        shutil.copytree(src, ck / tag)
        rewritten = sorted((ck / tag).glob("mp_rank_*_model_states.pt"))
        for f in rewritten:
            st = torch.load(f, weights_only=False)
            g = st["loader"]["global_batch_size"]
            st["loader"] = {**st["loader"], "consumed_samples": n * g,
                            "epoch": n * g // st["loader"]["samples_per_epoch"]}  # fmt: skip
            st.update(step=n, tokens_seen=n * g * 128, global_steps=n, global_samples=n * g)
            torch.save(st, f)
        meta = json.loads((ck / tag / "COMPLETE").read_text())
        if "files" in meta:  # COMPLETE lists sizes and checksums: record those of the rewritten files
            meta["files"].update(file_entries(ck / tag, [f.name for f in rewritten]))
        (ck / tag / "COMPLETE").write_text(json.dumps({**meta, "step": n}))
        (ck / "latest").write_text(tag)
        return tag

    runs: dict[str, dict[int, list[float]]] = {"wait_ms": {n: [] for n in STEPS}, "wall_s": {n: [] for n in STEPS},
                                               "peer_ms": {n: [] for n in STEPS}}  # fmt: skip
    for r in range(rounds):  # interleaved: 10, 1000, 100000, 10, ... so machine noise hits all alike
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
            runs["wait_ms"][n].append(row["resume_first_batch_s"] * 1e3)
            runs["wall_s"][n].append(wall)
            runs["peer_ms"][n].append(loaders.peer_ms(n))
            print(f"  trainer restart at step {n:>7}: wall {wall:.1f} s (imports, DeepSpeed init, checkpoint load, "
                  f"one step, final save); loader state to first batch {runs['wait_ms'][n][-1]:.0f} ms (first logged step "
                  f"{row['step']}); HF skip_first_batches {runs['peer_ms'][n][-1]:.0f} ms", flush=True)  # fmt: skip
            shutil.rmtree(ck, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="loader rounds (each: ours and HF at every step)")
    ap.add_argument("--restart-rounds", type=int, default=9, help="trainer restarts per step")
    ap.add_argument("--no-trainer", action="store_true", help="skip the whole-trainer restart part")
    a = ap.parse_args()
    rep = C.Report(__file__)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as d:
        tmp = Path(d)
        cfg_path = C.prepare_run(tmp / "data", "roberta", EXTRA_YAML)
        print(f"data stages on BBC: {time.perf_counter() - t_start:.0f}s")
        ld = Loaders(cfg_path)
        rep.line(f"loader: {ld.num_samples} train samples/epoch, {ld.steps_per_epoch} steps/epoch at global batch 4, "
                 f"1 DataLoader worker on both sides; construction {ld.build_s * 1e3:.0f} ms (not in the timings)")  # fmt: skip
        ld.check()
        rep.line("correctness: resumed first batch == batch N of an uninterrupted pass, for N = 10 and 1000")
        ours: dict[int, list[float]] = {n: [] for n in STEPS}
        peer: dict[int, list[float]] = {n: [] for n in STEPS}
        for _ in range(a.rounds):  # interleaved over N and sides: load drift hits all alike
            for n in STEPS:
                ours[n].append(ld.ours_ms(n))
                peer[n].append(ld.peer_ms(n))
        for n in STEPS:
            rep.compare(f"resume_latency_loader_step{n}_vs_hf_skip_first_batches", ours[n], peer[n], 1.0,
                        lower_is_better=True, unit="ms to first batch")  # fmt: skip
        rep.compare("resume_latency_loader_step100000_vs_step10", ours[100_000], ours[10], 1.1, lower_is_better=True,
                    unit="ms, ours at step 100,000 vs ours at step 10")  # fmt: skip
        if not a.no_trainer:
            tr = trainer_restart(tmp, cfg_path, ld, a.restart_rounds)
            for n in STEPS:
                rep.line(f"trainer restart at step {n}: wall median {statistics.median(tr['wall_s'][n]):.1f} s "
                         f"(imports, DeepSpeed init, checkpoint load, one step, final save)")  # fmt: skip
            for n in STEPS:
                rep.compare(f"resume_latency_trainer_first_batch_step{n}_vs_hf_skip_first_batches", tr["wait_ms"][n],
                            tr["peer_ms"][n], 1.0, lower_is_better=True, unit="ms to first batch")  # fmt: skip
            rep.compare("resume_latency_trainer_first_batch_step100000_vs_step10", tr["wait_ms"][100_000],
                        tr["wait_ms"][10], 1.1, lower_is_better=True, unit="ms, ours at step 100,000 vs step 10")  # fmt: skip
    print(f"total bench time {time.perf_counter() - t_start:.0f}s")
    return rep.finish()


if __name__ == "__main__":
    raise SystemExit(main())
