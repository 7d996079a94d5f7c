"""The loader's contract: exact resume at any world size, O(1) state, epochs, eval split, mixing, remote shards."""

from __future__ import annotations

import time

import fsspec
import numpy as np
import pytest
import torch

from core.run_layout import RunLayout
from data_pipeline.loader import PretrainLoader
from tests.data_pipeline.tokens_fixtures import tokenized_run


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    # ~90 docs -> a few hundred packed samples: an epoch is a handful of steps of 32
    return tokenized_run(
        tmp_path_factory.mktemp("ld"),
        limit=90,
        per_shard=30,
        overrides=["loader.num_workers=0", "loader.eval_fraction=0.05"],
    )


def take_steps(loaders: list[PretrainLoader], steps: int) -> list[list[tuple[int, int]]]:
    """Run `steps` optimizer steps on every rank; per step, the (sample_id, epoch) pairs in position order."""
    its = [iter(ld) for ld in loaders]
    ws, ga, mbs = loaders[0].world_size, loaders[0].grad_accum, loaders[0].micro
    out = []
    for _ in range(steps):
        step = [None] * (ws * ga * mbs)
        for m in range(ga):
            for r, it in enumerate(its):
                b = next(it)
                base = (m * ws + r) * mbs
                for j, (sid, ep) in enumerate(zip(b["sample_id"].tolist(), b["epoch"].tolist(), strict=True)):
                    step[base + j] = (sid, ep)
        out.append(step)
    return out


def test_resume_across_world_sizes_2_1_4(cfg):
    n = PretrainLoader(cfg, 0, 1).num_samples
    total = -(-(2 * n + 40) // 32)  # enough steps to cross two epoch boundaries
    ref = take_steps([PretrainLoader(cfg, 0, 1)], total)
    two = [PretrainLoader(cfg, r, 2) for r in range(2)]
    got = take_steps(two, 4)
    states = [ld.state_dict() for ld in two]
    assert states[0] == states[1] and states[0]["consumed_samples"] == 4 * 32
    one = PretrainLoader(cfg, 0, 1)
    one.load_state_dict(states[0])
    got += take_steps([one], 3)
    four = [PretrainLoader(cfg, r, 4) for r in range(4)]
    for ld in four:
        ld.load_state_dict(one.state_dict())
    got += take_steps(four, total - 7)
    assert got == ref  # the same samples in the same global order, whatever the world size
    flat = [s for step in got for s in step]
    assert len(flat) > 2 * n
    train_ids = {two[0].bases[0] + int(i) for i in two[0]._pools[0]}
    for e in (0, 1):  # each epoch: every training sample exactly once (none twice, none lost)
        ids = [sid for sid, _ in flat[e * n : (e + 1) * n]]
        assert len(ids) == len(set(ids)) == n and set(ids) == train_ids
        assert {ep for _, ep in flat[e * n : (e + 1) * n]} == {e}
    assert [sid for sid, _ in flat[:n]] != [sid for sid, _ in flat[n : 2 * n]]  # reshuffled per epoch


def test_state_is_small_and_load_is_o1(cfg):
    ld = PretrainLoader(cfg, 1, 2)
    state = ld.state_dict()
    assert set(state) >= {"seed", "epoch", "consumed_samples"} and len(repr(state)) < 400
    far = dict(state, consumed_samples=32 * 10**9)  # billions of samples in: no replay
    t = time.perf_counter()
    ld.load_state_dict(far)
    batch = next(iter(ld))
    assert time.perf_counter() - t < 2.0
    assert batch["input_ids"].shape == (8, 128) and ld.epoch == 32 * 10**9 // ld.num_samples
    with pytest.raises(ValueError, match=">= 0"):
        ld.load_state_dict(dict(state, consumed_samples=-1))
    with pytest.raises(ValueError, match="does not match"):
        ld.load_state_dict(dict(state, fingerprint=123))


def test_eval_split_is_disjoint_and_rank_balanced(cfg):
    train = PretrainLoader(cfg, 0, 1)
    ev = [PretrainLoader(cfg, r, 2, split="eval") for r in range(2)]
    ev_ids = [[i for b in ld for i in b["sample_id"].tolist()] for ld in ev]
    assert len(ev_ids[0]) == len(ev_ids[1]) > 0 and not set(ev_ids[0]) & set(ev_ids[1])
    train_ids = {sid for sid, _ in (s for step in take_steps([train], 12) for s in step)}
    assert not train_ids & (set(ev_ids[0]) | set(ev_ids[1]))
    assert ev_ids[0] == [i for b in ev[0] for i in b["sample_id"].tolist()]  # same every pass


def test_workers_give_identical_batches(cfg):
    a = iter(PretrainLoader(cfg, 1, 2))
    c = cfg.model_copy(deep=True)
    c.loader.num_workers = 2
    b = iter(PretrainLoader(c, 1, 2))
    for _ in range(5):
        x, y = next(a), next(b)
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_for_a_cuda_rank_are_page_locked(cfg, workers):
    """A CUDA rank's batches, the first (collated here) and those of the workers, come pinned, so the step's
    non-blocking copy to the device does not wait on the stream; the same batches as unpinned ones."""
    if not torch.cuda.is_available():
        pytest.skip("pinning needs a CUDA device")
    c = cfg.model_copy(deep=True)
    c.loader.num_workers = workers
    pinned, plain = iter(PretrainLoader(c, 0, 2, pin_memory=True)), iter(PretrainLoader(c, 0, 2))
    for _ in range(3):
        x, y = next(pinned), next(plain)
        assert all(x[k].is_pinned() and not y[k].is_pinned() for k in x)
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_collate_fn_receives_samples(cfg):
    seen = []

    def collate(samples):
        seen.append(samples)
        return len(samples)

    ld = PretrainLoader(cfg, 0, 2, collate_fn=collate)
    assert next(iter(ld)) == 8
    s = seen[0][0]
    assert s["input_ids"].dtype == np.int64 and s["input_ids"][0] == 0 and isinstance(s["epoch"], int)


def test_mixing_weights(tmp_path):
    base = ["loader.num_workers=0", "loader.eval_fraction=0"]
    c = tokenized_run(tmp_path, limit=80, per_shard=40, sources=("a", "b"), overrides=base)
    sizes = {n: s["split_samples"] for n, s in PretrainLoader(c, 0, 1).stats().items()}
    c.data.sources[1].weight = 3.0
    ld = PretrainLoader(c, 0, 1)  # scale: b drawn 3x per epoch, cycling through fresh permutations
    src, idx, cyc = ld.epoch_order(0)
    assert (src == 0).sum() == sizes["a"] and (src == 1).sum() == 3 * sizes["b"]
    for k in range(3):  # each pass over b is a full permutation of b
        assert sorted(idx[(src == 1) & (cyc == k)].tolist()) == list(range(sizes["b"]))
    c.loader.mixing = "proportion"
    ld = PretrainLoader(c, 0, 1)
    src, _, _ = ld.epoch_order(0)
    assert abs((src == 1).mean() - 0.75) < 0.01 and ld.num_samples == sizes["a"] + sizes["b"]
    assert len(set(ld.positions_keys(np.arange(64)))) == 64


def test_remote_shards_through_fsspec_cache(cfg, tmp_path):
    fs = fsspec.filesystem("memory")
    local = RunLayout(cfg).tokens
    for p in local.rglob("*"):
        if p.is_file() and not p.name.startswith("."):
            fs.pipe(f"/tokens-remote/{p.relative_to(local).as_posix()}", p.read_bytes())
    c = cfg.model_copy(deep=True)
    c.loader.tokens_url = "memory://tokens-remote"
    c.loader.cache_dir = str(tmp_path / "cache")
    remote, ref = iter(PretrainLoader(c, 0, 2)), iter(PretrainLoader(cfg, 0, 2))
    for _ in range(3):
        x, y = next(remote), next(ref)
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert any((tmp_path / "cache").iterdir())
    # a corrupted remote copy is caught by the manifest checksum
    fs.pipe("/tokens-remote/bbc/shard-00000.bin", b"\0" * 64)
    c.loader.cache_dir = str(tmp_path / "cache2")
    with pytest.raises(ValueError, match="checksum"):
        PretrainLoader(c, 0, 2)


def test_global_batch_change_continues_exactly(cfg):
    ref = [s for step in take_steps([PretrainLoader(cfg, 0, 1)], 5) for s in step]  # 160 samples at G=32
    first = PretrainLoader(cfg, 0, 1)
    got = [s for step in take_steps([first], 1) for s in step]  # 32
    c = cfg.model_copy(deep=True)
    c.batch.global_batch_size = 64
    bigger = [PretrainLoader(c, r, 2) for r in range(2)]
    for ld in bigger:
        ld.load_state_dict(first.state_dict())
    got += [s for step in take_steps(bigger, 2) for s in step]  # 128 more
    assert got == ref


def test_empty_eval_split_is_allowed(cfg):
    c = cfg.model_copy(deep=True)
    c.loader.eval_fraction = 0.0
    ev = PretrainLoader(c, 0, 2, split="eval")
    assert ev.num_samples == 0 and list(ev) == []


def test_first_batch_is_made_here_while_workers_start(cfg):
    """Resume latency: the first micro-batch of an iteration is collated in this process (workers start up in
    the background meanwhile), the rest by the workers; the batches and the consumed count are those of a loader
    without workers."""
    import os

    def collate(samples):
        return os.getpid(), [int(s["sample_id"]) for s in samples]

    c = cfg.model_copy(deep=True)
    c.loader.num_workers = 1
    ref = PretrainLoader(cfg, 0, 2, collate_fn=collate)
    ld = PretrainLoader(c, 0, 2, collate_fn=collate)
    for x in (ref, ld):
        x.consumed = 3 * x.global_batch
    it, it_ref = iter(ld), iter(ref)
    got = [next(it) for _ in range(2 * ld.grad_accum + 1)]
    assert [g[1] for g in got] == [next(it_ref)[1] for _ in range(len(got))]
    assert got[0][0] == os.getpid() and all(g[0] != os.getpid() for g in got[1:])
    assert ld.consumed == ref.consumed == 5 * ld.global_batch


def test_eval_per_source_covers_each_source_alone(tmp_path):
    """Issue 44 item 1: the eval loader reads one source at a time; every rank gets as many micro-batches (the
    forwards' collectives stay matched), the real samples are exactly the source's first held-out samples, each
    once, and a rank whose share ran out gets a weight-0 stand-in."""
    c = tokenized_run(
        tmp_path,
        limit=80,
        per_shard=40,
        sources=("a", "b"),
        overrides=["loader.num_workers=0", "loader.eval_fraction=0.2"],
    )
    ranks = [PretrainLoader(c, r, 2, split="eval") for r in range(2)]
    bases = dict(zip(ranks[0].source_names, ranks[0].bases, strict=True))
    for name in ranks[0].source_names:
        pool = {int(i) + bases[name] for i in ranks[0]._pools[ranks[0].source_names.index(name)]}
        assert pool, name
        for cap in (1, 1000):
            got = [list(ld.iter_source(name, cap)) for ld in ranks]
            assert len(got[0]) == len(got[1]) == ranks[0].source_eval_batches(name, cap) > 0
            real = [i for per_rank in got for w, b in per_rank for i in b["sample_id"].tolist()[:w]]
            assert len(real) == len(set(real)) and set(real) <= pool
            assert all(w == len(b["sample_id"]) or w < ranks[0].micro for r in got for w, b in r)
            if cap == 1000:
                assert set(real) == pool  # every held-out sample of the source, no other source's
            else:
                assert len(real) == min(len(pool), 2 * ranks[0].micro)
    assert PretrainLoader(c, 0, 2).source_eval_batches("a", 10) == 0  # a train loader has none
