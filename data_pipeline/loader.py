"""The deterministic streaming loader (contract 5): what each data-parallel rank consumes, step by step.

The whole training sample order is a pure function of (seed, epoch): per source, a seeded permutation of its
training samples (drawn round(weight x n) per epoch, cycling through fresh permutations when up-sampled), all
sources' picks shuffled together by a second seeded permutation. Global position p is epoch p // N, index p % N.
One optimizer step consumes positions [k*G, (k+1)*G) (G = global batch), whatever the world size; inside a step,
micro-batch m of rank r takes positions c + k*G + (m*world + r)*mbs + [0, mbs) (c = consumed at the start of this
iteration, k the step since then). The state is therefore only the
number of consumed samples: resuming is O(1) (no replay), and a resumed run with another world size consumes
exactly the positions not yet consumed. Eval samples are chosen by a hash of (seed, source, sample index) and
never appear in training.

Collation runs in torch DataLoader workers; workers receive (source, sample, pass) triples from the sampler in
the main process and read memory-mapped shards, so nothing but indices crosses process boundaries.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data_pipeline.packing import PackedSource, build_packed_sources
from data_pipeline.token_shards import open_token_shards
from runconfig import RunConfig

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised: a uniform 64-bit hash of each element."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _salt(*parts: object) -> int:
    return int.from_bytes(
        hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "little"
    )


def eval_mask(n: int, fraction: float, seed: int, source: str) -> np.ndarray:
    """Which of a source's packed samples are held out for evaluation (stable for a given packing)."""
    if fraction <= 0:
        return np.zeros(n, bool)
    h = _mix64(np.arange(n, dtype=np.uint64) ^ np.uint64(_salt("eval", seed, source)))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction


class _Samples(Dataset):
    """Map-style view for DataLoader workers: item = (source index, packed sample index, pass) -> sample dict."""

    def __init__(self, sources: list[PackedSource], bases: list[int]):
        self.sources, self.bases = sources, bases

    def __len__(self) -> int:
        return sum(len(s) for s in self.sources)

    def __getitem__(self, key: tuple[int, int, int]) -> dict[str, Any]:
        s, i, epoch = key
        out = self.sources[s][i]
        out["sample_id"] = np.int64(self.bases[s] + i)
        out["epoch"] = int(epoch)
        return out


def default_collate(pad_id: int) -> Callable[[list[dict]], dict[str, torch.Tensor]]:
    """Stack samples; variable-length ones (line_by_line) are right-padded with an attention mask."""

    def collate(samples: list[dict]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        lens = [len(s["input_ids"]) for s in samples]
        width = max(lens)
        for key in samples[0]:
            vals = [s[key] for s in samples]
            if isinstance(vals[0], np.ndarray) and vals[0].ndim == 1:
                fill = pad_id if key == "input_ids" else 0
                arr = np.full((len(vals), width), fill, np.int64)
                for r, v in enumerate(vals):
                    arr[r, : len(v)] = v
                out[key] = torch.from_numpy(arr)
            else:
                out[key] = torch.as_tensor(np.asarray(vals))
        if len(set(lens)) > 1:
            out["attention_mask"] = (torch.arange(width)[None, :] < torch.as_tensor(lens)[:, None]).long()
        return out

    return collate


def _ignore_stop_signals(_worker_id: int) -> None:
    """Keep stop signals meant for the rank away from its DataLoader workers, so the rank can finish its step
    and checkpoint: torchrun SIGTERMs each rank's whole process group (the worker moves to its own group) and
    Slurm signals every process of a step with USR1 (ignored here). SIGTERM itself keeps its default action,
    so DataLoader shutdown and interpreter exit can still terminate the worker; an orphaned worker exits on
    its own when it sees its parent gone."""
    import os
    import signal

    os.setpgrp()
    for s in (signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)


def _pinned(batch: Any) -> Any:
    """The first micro-batch, collated outside the DataLoader, pinned as the DataLoader pins the others."""
    if isinstance(batch, dict):
        return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch.pin_memory() if isinstance(batch, torch.Tensor) else batch


class PretrainLoader:
    """This rank's micro-batches. Train: endless (epoch after epoch); eval: one pass over the held-out samples."""

    def __init__(
        self,
        cfg: RunConfig,
        rank: int,
        world_size: int,
        split: str = "train",
        collate_fn: Callable[[list[dict]], Any] | None = None,
        tokens_dir: str | None = None,
        pin_memory: bool = False,
    ):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in world of {world_size}")
        from core.run_layout import RunLayout

        self.cfg, self.rank, self.world_size, self.split = cfg, rank, world_size, split
        # Page-locked batches for a CUDA rank: the step's `to(device, non_blocking=True)` is then a real async copy;
        # from pageable memory the driver stages it and may wait on the stream (as llm-foundry and Megatron pin).
        self.pin_memory = pin_memory
        lc = cfg.loader
        layout = RunLayout(cfg)
        url = tokens_dir or lc.tokens_url or str(layout.tokens)
        fetched = tokens_dir is None and lc.tokens_url is None and layout.store.remote is not None
        if fetched:  # a remote run: the shards are copied into the staging folder once, then memory-mapped
            layout.store.pull([layout.tokens])
        self.manifest, shards = open_token_shards(
            url, cache_dir=lc.cache_dir, check=fetched, checksums=lc.verify_checksums
        )
        remote = "://" in url and not url.startswith("file://")
        index_dir = (Path(lc.cache_dir) if remote else Path(url.removeprefix("file://"))) / "pack-index"
        packed = build_packed_sources(cfg, self.manifest, shards, cache_dir=index_dir)
        self.source_names = list(packed)
        self.sources = [packed[n] for n in self.source_names]
        self.bases = list(np.cumsum([0] + [len(s) for s in self.sources[:-1]]).tolist())
        self.seed = cfg.run.seed
        self.plan = cfg.batch_plan(world_size)
        self.global_batch = self.plan["global_batch_size"]
        self.micro = self.plan["micro_batch_size"]
        self.grad_accum = self.plan["grad_accum"]
        self.collate_fn = collate_fn or default_collate(int(self.manifest["special_ids"]["pad"] or 0))
        weights = {s.name: s.weight for s in cfg.data.sources}

        self._pools: list[np.ndarray] = []  # per source: packed indices in this split
        for name, src in zip(self.source_names, self.sources, strict=True):
            ev = eval_mask(len(src), lc.eval_fraction, self.seed, name)
            self._pools.append(np.flatnonzero(ev if split == "eval" else ~ev))
        n = np.array([len(p) for p in self._pools], np.int64)
        if split == "train":
            w = np.array([weights[s] for s in self.source_names], np.float64)
            if lc.mixing == "scale":
                counts = np.rint(w * n)
            else:  # shares among the sources that have samples
                w = np.where(n > 0, w, 0.0)
                counts = np.rint(n.sum() * w / w.sum())
            self._counts = np.where(n > 0, np.maximum(counts, 1), 0).astype(np.int64)
        else:
            self._counts = n
        self.num_samples = int(self._counts.sum())
        if self.num_samples == 0 and split == "train":
            raise ValueError(f"train split is empty: {dict(zip(self.source_names, n.tolist(), strict=True))}")
        self.tokens_per_sample = self.sources[0].tokens_per_sample
        self.consumed = 0
        self._epoch_cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._fingerprint = _salt(
            self.manifest["tokenizer"]["sha256"],
            self.manifest["totals"],
            cfg.packing,
            lc.eval_fraction,
            lc.mixing,
            lc.shuffle,
            sorted(weights.items()),
            self.seed,
        )

    # ------------------------------------------------------------------ order
    def _source_picks(self, s: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source s's picks for an epoch: slice [e*c, (e+1)*c) of its endless chain of permutations."""
        pool, c = self._pools[s], int(self._counts[s])
        n = len(pool)
        if c == 0 or n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pos = np.arange(epoch * c, (epoch + 1) * c, dtype=np.int64)
        cycle, k = pos // n, pos % n
        out = np.empty(c, np.int64)
        for cy in np.unique(cycle):
            sel = cycle == cy
            if self.cfg.loader.shuffle:
                perm = np.random.default_rng(
                    [self.seed, _salt("src", self.source_names[s]) >> 1, int(cy)]
                ).permutation(n)
            else:
                perm = np.arange(n)
            out[sel] = pool[perm[k[sel]]]
        return out, cycle

    def epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source index, packed sample index, pass over that source) for every position of an epoch."""
        if epoch in self._epoch_cache:
            return self._epoch_cache[epoch]
        if self.split == "eval":
            src = np.concatenate([np.full(len(p), s, np.int64) for s, p in enumerate(self._pools)])
            idx = np.concatenate(self._pools)
            order = (src, idx, np.zeros(len(idx), np.int64))
        else:
            parts = [self._source_picks(s, epoch) for s in range(len(self.sources))]
            src = np.concatenate([np.full(len(p[0]), s, np.int64) for s, p in enumerate(parts)])
            idx = np.concatenate([p[0] for p in parts])
            cyc = np.concatenate([p[1] for p in parts])
            if self.cfg.loader.shuffle:
                perm = np.random.default_rng([self.seed, _salt("mix") >> 1, epoch]).permutation(len(idx))
                src, idx, cyc = src[perm], idx[perm], cyc[perm]
            order = (src, idx, cyc)
        if len(self._epoch_cache) >= 2:
            self._epoch_cache.pop(min(self._epoch_cache))
        self._epoch_cache[epoch] = order
        return order

    def positions_keys(self, positions: np.ndarray) -> list[tuple[int, int, int]]:
        """Global positions -> dataset keys (crossing epoch boundaries as needed)."""
        keys = []
        epochs = positions // self.num_samples
        for e in np.unique(epochs):
            sel = positions[epochs == e] % self.num_samples
            src, idx, cyc = self.epoch_order(int(e))
            keys += list(zip(src[sel].tolist(), idx[sel].tolist(), cyc[sel].tolist(), strict=True))
        return keys

    def _micro_positions(self, start: int, step: int, m: int) -> np.ndarray:
        base = start + step * self.global_batch + (m * self.world_size + self.rank) * self.micro
        return np.arange(base, base + self.micro, dtype=np.int64)

    def _train_batches(self, start: int) -> Iterator[list[tuple[int, int, int]]]:
        step = 0
        while True:
            for m in range(self.grad_accum):
                yield self.positions_keys(self._micro_positions(start, step, m))
            step += 1

    def _eval_batches(self) -> Iterator[list[tuple[int, int, int]]]:
        # every rank gets the same number of batches (collectives stay matched)
        per = self.micro * self.world_size
        for b in range(self.num_samples // per):
            base = b * per + self.rank * self.micro
            yield self.positions_keys(np.arange(base, base + self.micro, dtype=np.int64))

    @property
    def eval_batches(self) -> int:
        return self.num_samples // (self.micro * self.world_size) if self.split == "eval" else 0

    def source_eval_batches(self, name: str, max_batches: int) -> int:
        """Eval micro-batches of source `name` on every rank: its held-out samples spread over the ranks, the last
        batch short or empty where they run out, at most `max_batches` (0 on a train loader)."""
        if self.split != "eval":
            return 0
        n = len(self._pools[self.source_names.index(name)])
        return min(max_batches, -(-n // (self.micro * self.world_size)))

    def iter_source(self, name: str, max_batches: int) -> Iterator[tuple[int, Any]]:
        """(samples, micro-batch) of this rank for source `name` alone, as many on every rank (so the forwards'
        collectives stay matched, ZeRO-3's included). A rank whose share ran out reads the source's first sample
        again with weight 0, so a small source still gets a figure from every sample it holds."""
        s = self.source_names.index(name)
        pool, per = self._pools[s], self.micro * self.world_size
        keys, weights = [], []
        for b in range(self.source_eval_batches(name, max_batches)):
            lo = b * per + self.rank * self.micro
            idx = pool[lo : lo + self.micro]
            weights.append(len(idx))
            keys.append([(s, int(i), 0) for i in (idx if len(idx) else pool[:1])])
        return zip(weights, self._batches(iter(keys)), strict=True)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        start = self.consumed
        sampler: Any = self._train_batches(start) if self.split == "train" else self._eval_batches()
        for i, batch in enumerate(self._batches(sampler)):
            if self.split == "train" and (i + 1) % self.grad_accum == 0:
                # the step this micro-batch completes counts as consumed once the caller takes it
                self.consumed = start + (i + 1) // self.grad_accum * self.global_batch
            yield batch

    def _batches(self, sampler: Iterator[list[tuple[int, int, int]]]) -> Iterator[Any]:
        """Collated micro-batches of the sampler's keys, read by DataLoader workers (loader.num_workers)."""
        lc = self.cfg.loader
        kwargs: dict[str, Any] = {}
        if lc.num_workers > 0:
            kwargs = {
                "num_workers": lc.num_workers,
                "prefetch_factor": lc.prefetch_factor,
                "worker_init_fn": _ignore_stop_signals,
            }
        dataset = _Samples(self.sources, self.bases)
        first = None
        if kwargs:
            # Resume latency: the first micro-batch is read and collated here while the workers start up (a
            # worker's fork and first round trip cost ~50-100 ms, more than the batch itself); the workers take
            # over from the second. Same batches: every random decision is a function of (seed, epoch, sample id).
            first = next(sampler, None)
        dl = DataLoader(
            dataset, batch_sampler=sampler, collate_fn=self.collate_fn, pin_memory=self.pin_memory, **kwargs
        )
        batches = iter(dl)  # with workers: they start now, in the background
        if first is not None:
            batch = self.collate_fn([dataset[k] for k in first])
            batches = itertools.chain([_pinned(batch) if self.pin_memory else batch], batches)
        yield from batches

    # ------------------------------------------------------------------ state
    @property
    def epoch(self) -> int:
        return self.consumed // self.num_samples if self.num_samples else 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed_samples": int(self.consumed),
            "samples_per_epoch": self.num_samples,
            "global_batch_size": self.global_batch,
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """O(1): the position is all there is. Refuses a state from different data or packing."""
        if state.get("fingerprint") != self._fingerprint or state.get("seed") != self.seed:
            raise ValueError(
                "loader state does not match this data/packing/seed (token shards, packing, weights or seed "
                "changed since the checkpoint); refusing to resume into a different sample order"
            )
        if int(state["consumed_samples"]) < 0:
            raise ValueError(f"consumed_samples must be >= 0, got {state['consumed_samples']}")
        # positions are absolute, so a changed global batch size also continues exactly where the last one stopped
        self.consumed = int(state["consumed_samples"])

    def stats(self) -> dict[str, Any]:
        return {
            name: {**src.stats(), "split_samples": int(len(pool)), "per_epoch": int(c)}
            for name, src, pool, c in zip(
                self.source_names, self.sources, self._pools, self._counts, strict=True
            )
        }
