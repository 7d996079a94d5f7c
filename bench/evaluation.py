"""Evaluation as the field does it (issue 68): the run's local lm-evaluation-harness tasks (`python -m
data_pipeline eval-tasks`: BBC topic choice, a last-word cloze and rolling perplexity over BBC's hold-out, text
pretraining never saw) scored in the loop (`eval.tasks`) and on the export (`python -m adapt evaluate`).

Data and model: the demo (configs/demo.yaml: the WARC sample crawl + BBC News, BPE 4K, GPT-2-style 4 x 128, ZeRO-2,
2 CPU ranks), trained for `--steps` optimizer steps (a fixed amount of work, not the demo's 4-minute budget, so
any host trains the same model) with `eval.tasks: [lmstack]` at the demo's eval interval (200 steps) and
`eval.tasks_limit` at its default; exported; a random-init export of the same shape (the export's config through
`AutoModelForCausalLM.from_config`, seed 0) beside it.

VERDICTs:
- parity: for each task, the largest difference between the in-loop figures of the last step and `adapt evaluate`
  on the export with the same limit, over every metric (relative to the figure where it exceeds 1: the
  perplexities), within 1e-3;
- the export above random init: the cloze's accuracy (at least 1 point) and the perplexity task's word perplexity
  (below random init's);
- cost: each eval interval's in-loop scoring time (rank 0's `tasks/seconds`, which the other ranks wait for) over
  the interval's training time (its rows' time, less the previous eval's), the median over the intervals, <= 0.05.

Beside them: `adapt evaluate` (loads the folder and the tasks each time) against the in-loop scorer (tasks loaded
once) on the same export, in alternating rounds, and the in-loop random-init figures of step 0.

`python bench/evaluation.py [--steps 1000] [--rounds 5]` (about 12 minutes on 2 quiet cores)
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

ROOT = C.ROOT
EVERY = 200  # the demo's eval.every_steps
HEADLINE = {"choice": "acc", "cloze": "acc", "ppl": "word_perplexity"}


def rows(run: Path, split: str) -> dict[int, dict]:
    out = {}
    for line in (run / "logs" / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("split") == split:
            out[r["step"]] = r
    return out


def in_loop(row: dict, task: str) -> dict[str, float]:
    prefix = f"tasks/{task}/"
    return {
        k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix) and not k.endswith("_random_init")
    }


def difference(a: float, b: float) -> float:
    """|a - b|, relative to |b| where |b| > 1 (a perplexity): the parity tolerance's scale."""
    return abs(a - b) / max(1.0, abs(b))


def interval_costs(train: dict[int, dict], evals: dict[int, dict]) -> list[tuple[float, float]]:
    """(in-loop seconds, training seconds) per eval interval (k - EVERY, k]: a row's time is its tokens over its
    rate, and the row after an eval carries that eval's time, taken out of the next interval's training time."""
    out = []
    steps = sorted(s for s in evals if s > 0 and s % EVERY == 0)
    prev_tokens = {s: 0 for s in train}
    last = 0
    for s in sorted(train):
        prev_tokens[s] = last
        last = train[s]["tokens_seen"]
    for k in steps:
        wall = sum(
            (train[s]["tokens_seen"] - prev_tokens[s]) / train[s]["tokens_per_s"]
            for s in train
            if k - EVERY < s <= k
        )
        before = k - EVERY
        # the meter starts before the step-0 (random-init) scoring, so the first interval carries it too
        wall -= evals[before].get("tasks/seconds", 0.0) if before in evals else 0.0
        out.append((evals[k]["tasks/seconds"], wall))
    return out


def random_export(export: Path, dest: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(export))
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(export).save_pretrained(dest)
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000, help="optimizer steps of the demo recipe")
    ap.add_argument(
        "--rounds", type=int, default=5, help="alternating rounds of adapt evaluate vs the scorer"
    )
    a = ap.parse_args()
    rep = C.Report(__file__)
    from adapt.evaluate import evaluate
    from pretrain.run.harness import TaskScorer, figures
    from runconfig import load_config

    work = Path(tempfile.mkdtemp(prefix="bench-evaluation-"))
    run = work / "run"
    overrides = [
        f"run.output_dir={run}",
        "schedule.budget_minutes=null",
        f"schedule.total_steps={a.steps}",
        f"eval.every_steps={EVERY}",
        "eval.tasks=[lmstack]",
        "logging.progress_bar=false",
        "data.clean.progress=false",
    ]
    demo = ROOT / "configs" / "demo.yaml"
    cfg = load_config(demo, overrides)
    limit = cfg.eval.tasks_limit
    try:
        t0 = time.perf_counter()
        C.run_cmd([sys.executable, "-m", "data_pipeline", "all", "--config", str(demo), *overrides], 1800)
        rep.line(f"data stages (demo: crawl + BBC): {time.perf_counter() - t0:.0f}s")
        res, wall = C.torchrun(
            2, ["-m", "pretrain", "train", "--config", str(demo), *overrides], timeout=3600
        )
        result = json.loads(res.stdout[res.stdout.index("{") :])
        rep.line(f"training: {result['step']} steps in {result['elapsed_s']:.0f}s (wall {wall:.0f}s)")
        C.run_cmd([sys.executable, "-m", "pretrain", "export", "--config", str(demo), *overrides], 1800)
        export, rand = run / "export", random_export(run / "export", work / "random-init")

        evals, train = rows(run, "eval"), rows(run, "train")
        last = max(evals)
        names = sorted({k.split("/")[1] for k in evals[last] if k.startswith("tasks/") and k.count("/") == 2})
        scored = figures(evaluate(export, names, limit=limit, device="cpu"))
        scored_random = figures(
            evaluate(rand, names, tasks_dir=run / "eval_tasks", limit=limit, device="cpu")
        )

        for task in names:
            kind = task.rsplit("_", 1)[1]
            ours, theirs = in_loop(evals[last], task), scored[task]
            diffs = {m: difference(ours[m], theirs[m]) for m in theirs}
            worst = max(diffs, key=lambda m: diffs[m])
            rep.line(
                f"{task} (limit {limit}): in the loop at step {last} "
                + ", ".join(f"{m} {ours[m]:.6g}" for m in sorted(theirs))
                + "; adapt evaluate on the export "
                + ", ".join(f"{m} {theirs[m]:.6g}" for m in sorted(theirs))
                + "; random-init export "
                + ", ".join(f"{m} {scored_random[task][m]:.6g}" for m in sorted(theirs))
                + "; in-loop random init (step 0) "
                + ", ".join(
                    f"{m} {evals[0].get(f'tasks/{task}/{m}', float('nan')):.6g}" for m in sorted(theirs)
                )
            )
            m = HEADLINE[kind]
            rep.within(
                f"evaluation_parity_{task}_in_loop_vs_adapt_evaluate",
                ours[worst],
                theirs[worst],
                diffs[worst],
                1e-3,
            )
            if kind == "cloze":
                rep.margin(
                    f"evaluation_{task}_acc_export_vs_random_init", theirs[m], scored_random[task][m], 1.0
                )
            if kind == "ppl":
                rep.verdict(
                    f"evaluation_{task}_word_perplexity_export_vs_random_init",
                    theirs[m],
                    scored_random[task][m],
                    1.0,
                    lower_is_better=True,
                )

        costs = interval_costs(train, evals)
        rep.compare(
            f"evaluation_in_loop_cost_vs_training_time_at_every_{EVERY}_steps",
            [c[0] for c in costs],
            [c[1] for c in costs],
            0.05,
            lower_is_better=True,
            unit="s per eval interval: in-loop scoring vs training",
        )

        model_cls = __import__("transformers").AutoModelForCausalLM
        model = model_cls.from_pretrained(export)
        scorer = TaskScorer(names, run / "eval_tasks", export, limit, cfg.finetune.eval_batch_size)

        def cli() -> float:
            t = time.perf_counter()
            evaluate(export, names, limit=limit, device="cpu", out=work / "scratch")
            return time.perf_counter() - t

        inloop, adapt = C.alternate(lambda: scorer.score(model)[1], cli, a.rounds)
        med = statistics.median
        rep.line(
            f"the same {len(names)} tasks on the export, {a.rounds} alternating rounds: the in-loop scorer "
            f"median {med(inloop):.2f}s (min {min(inloop):.2f}, max {max(inloop):.2f}), `adapt evaluate` median "
            f"{med(adapt):.2f}s (min {min(adapt):.2f}, max {max(adapt):.2f}; it loads the folder and the tasks)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
