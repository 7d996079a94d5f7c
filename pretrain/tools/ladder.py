"""`python -m pretrain ladder`: small runs of one family that predict a bigger one (OLMo-core's model ladder).

Each rung is the config's model at another width (and depth), trained on `tokens_per_param` times its
non-embedding parameters (Kaplan et al. 2020 count those: at small sizes the embedding is most of the model and
hides the trend), from the same token shards and tokenizer, into `<run>/ladder/<rung>/`. The held-out loss of
each rung (its last full evaluation) is fitted by the power law with an irreducible term that Chinchilla's
approach 3 (Hoffmann et al. 2022) uses, at a fixed tokens-per-parameter multiple, where data and parameters grow
together and the two power terms are one:

    L(N) = E + A * (N / N0) ** -alpha        (N0: the smallest rung's N, for conditioning)

fitted by least squares on the losses (scipy's curve_fit, bounded: E in [0, min L), alpha in (0, 3]). The fit
error is the RMS relative residual and, with four rungs or more, the leave-one-out relative error (three rungs
fix three parameters: their residual is zero and says nothing). The table (`ladder.json`, `ladder.md`) and the
PNG of the fit go to `<run>/ladder/`, with the prediction for `--predict` rungs not trained.

Each rung's global batch and peak LR scale with its parameters from the config's own (the user's tuned point):
batch x (N/Nc)^(2/3), LR x (N/Nc)^(-1/3), the exponents of Porian et al. 2024 ("Resolving discrepancies in
compute-optimal scaling of language models") that OLMo-core's ladder uses (anchored there at a 108M model, whose
fit extrapolated to a 25k-parameter rung would give it LR 0.08; we anchor at the config). `hparams="fixed"` gives
every rung the config's batch and LR, as this ladder first did: the small rungs then get few steps at a larger
rung's LR, are held back more than the big ones, and the fitted curve bends the wrong way (measured: E fitted at
its bound 0 and the next rung predicted 8.7% high). A μP config (`model.parametrization: mup`) keeps its LR:
μP's multipliers already carry it across widths.

A rung is done when its `rung.json` is written (after its run finished); a killed ladder reruns only the rungs
without one, and an unfinished rung resumes from its own latest complete checkpoint (the trainer's auto-resume).
A rung whose settings changed since (another --hparams, --tokens-per-param or override), finished or not, starts
over in a cleared folder (`claim_folder`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.errors import ConfigError, LmstackError
from core.exit_codes import PREEMPTED, USAGE
from core.io import atomic_write
from core.log import get_logger
from runconfig import RunConfig, load_config
from runconfig.load import apply_override, parse_overrides, to_dict

log = get_logger(__name__)

RUNG_FILE = "rung.json"
# the overrides a proxy run's folder trains under, written before each run (`claim_folder`)
STARTED_FILE = "started.json"
# the links to the run's data stages in a proxy run's folder (`share_data`), kept when it is cleared
SHARED_DATA = ("tokens", "tokenizer")
_SPEC = re.compile(r"^(\d+)(?:x(\d+))?$")


class LadderError(LmstackError):
    """A rung (or a mixture's proxy run) that failed, was stopped or cannot run: named, with its log. Its exit
    code is the run's own (a stop at a signal: PREEMPTED), else USAGE."""

    def __init__(self, message: str, exit_code: int = USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


HPARAMS = ("scaled", "fixed")
BATCH_EXPONENT = 2 / 3  # global batch ~ N^(2/3) (Porian et al. 2024, as OLMo-core's ladder)
LR_EXPONENT = -1 / 3  # peak AdamW LR ~ N^(-1/3) (the same)


@dataclass
class Anchor:
    """The config's own model, where a scaled ladder's batch and LR are the config's."""

    params: int  # non-embedding parameters
    global_batch: int  # sequences
    micro_batch: int
    lr: float  # the peak LR at that batch (after lr_scaling)
    scale_lr: bool  # False under μP, whose multipliers carry the LR across widths


@dataclass
class Rung:
    name: str  # w<width>-l<layers>
    width: int
    layers: int
    heads: int
    ffn: int
    params: int  # non-embedding parameters
    total_params: int
    tokens: int
    steps: int
    global_batch: int = 0  # sequences per step (0: the config's)
    micro_batch: int = 0
    lr: float = 0.0  # peak LR (0: the config's)

    @property
    def overrides(self) -> list[str]:
        out = [
            f"model.hidden_size={self.width}",
            f"model.num_layers={self.layers}",
            f"model.num_heads={self.heads}",
            f"model.ffn_size={self.ffn}",
        ]
        if self.global_batch:
            out += [
                f"batch.global_batch_size={self.global_batch}",
                "batch.global_batch_tokens=null",
                f"batch.micro_batch_size={self.micro_batch}",
            ]
        if self.lr:
            # the rung's LR is the scaled one already: a batch rule must not scale it again
            out += [f"optim.lr={self.lr:.6g}", "lr_scaling.rule=none"]
        return out


def anchor_of(cfg: RunConfig) -> Anchor:
    from pretrain.run.schedule import scaled_lr_and_warmup

    bp = cfg.batch_plan()
    return Anchor(
        params=non_embedding_params(cfg)[0],
        global_batch=bp["global_batch_size"],
        micro_batch=bp["micro_batch_size"],
        lr=scaled_lr_and_warmup(cfg, bp["global_batch_size"])[0],
        scale_lr=cfg.model.parametrization != "mup",
    )


def scaled_batch(anchor: Anchor, ratio: float, ranks: int) -> tuple[int, int]:
    """(global, micro) sequences for a rung `ratio` times the anchor's parameters: batch x ratio^(2/3), per rank
    split into the fewest micro-batches no bigger than the config's, so the rounding is at most half a sequence
    per micro-batch (rounding to whole config micro-batches halved a width-96 rung's batch, and at this scale
    the number of steps moves the loss more than the width)."""
    per_rank = max(1.0, anchor.global_batch * ratio**BATCH_EXPONENT / ranks)
    accum = math.ceil(per_rank / anchor.micro_batch)
    micro = max(1, round(per_rank / accum))
    return ranks * micro * accum, micro


def non_embedding_params(cfg: RunConfig) -> tuple[int, int]:
    """(non-embedding, total) parameters of the config's module, counted on the meta device. A tied LM head is
    the embedding's weight, so it is left out with it."""
    import torch

    from pretrain.tools.plan import meta_module

    model = meta_module(cfg)
    params = {id(p): p.numel() for p in model.parameters()}
    embedded = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(n for i, n in params.items() if i not in embedded), sum(params.values())


def parse_rungs(spec: str, key: str = "--rungs") -> list[tuple[int, int | None]]:
    """'64,128,192x3' -> [(64, None), (128, None), (192, 3)]: widths, each with its depth if given."""
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        m = _SPEC.match(part)
        if not m:
            raise ConfigError(f"{key}: '{part}' is not WIDTH or WIDTHxLAYERS (e.g. 64,128,192x3)")
        out.append((int(m.group(1)), int(m.group(2)) if m.group(2) else None))
    if not out:
        raise ConfigError(f"{key}: no rung given")
    return out


def make_rung(
    cfg: RunConfig, width: int, layers: int | None, tokens_per_param: float, anchor: Anchor | None = None
) -> Rung:
    """The config's model at `width` (heads keep the config's head size, the FFN its ratio to the width); with an
    `anchor`, its batch and LR scaled from the anchor's (module docstring), else the config's."""
    head_dim = cfg.model.hidden_size // cfg.model.num_heads
    if width % head_dim:
        raise ConfigError(f"--rungs: width {width} is not a multiple of the config's head size {head_dim}")
    layers = layers or cfg.model.num_layers
    ffn = round(width * cfg.model.ffn_size / cfg.model.hidden_size)
    rung = Rung(f"w{width}-l{layers}", width, layers, width // head_dim, ffn, 0, 0, 0, 0)
    try:
        sized = sized_config(cfg, rung)
    except ValidationError as err:  # the config refuses this shape (e.g. narrower than μP's base width)
        raise ConfigError(f"--rungs: rung {rung.name}: {err.errors()[0]['msg']}") from err
    rung.params, rung.total_params = non_embedding_params(sized)
    rung.tokens = round(tokens_per_param * rung.params)
    tokens_per_step = cfg.batch_plan()["global_batch_size"]
    if anchor is not None:
        ratio = rung.params / anchor.params
        rung.global_batch, rung.micro_batch = scaled_batch(anchor, ratio, cfg.launch.world_size)
        rung.lr = anchor.lr * ratio**LR_EXPONENT if anchor.scale_lr else 0.0
        tokens_per_step = rung.global_batch
    tokens_per_step *= cfg.packing.seq_len
    rung.steps = max(1, math.ceil(rung.tokens / tokens_per_step))
    return rung


def fit_power_law(params: list[int], losses: list[float]) -> dict[str, Any]:
    """E, A, alpha of L(N) = E + A (N/N0)^-alpha, with the RMS relative residual and, from four points, the
    leave-one-out relative error."""
    import numpy as np
    from scipy.optimize import OptimizeWarning, curve_fit

    if len(params) < 3:
        raise ConfigError(
            f"--rungs: a fit with an irreducible term needs 3 rungs or more (got {len(params)})"
        )
    n0 = float(min(params))

    def law(n, e, a, alpha):
        return e + a * (n / n0) ** -alpha

    def fit(ns, ls):
        import warnings

        warnings.simplefilter("ignore", OptimizeWarning)  # 3 points, 3 parameters: no covariance, by design
        lo = min(ls)
        p0 = [0.5 * lo, max(ls) - 0.5 * lo, 0.3]
        (e, a, alpha), _ = curve_fit(
            law,
            np.array(ns, float),
            np.array(ls, float),
            p0=p0,
            bounds=([0.0, 0.0, 1e-3], [lo, np.inf, 3.0]),
            maxfev=20000,
        )
        return float(e), float(a), float(alpha)

    e, a, alpha = fit(params, losses)
    rel = [(law(n, e, a, alpha) - loss) / loss for n, loss in zip(params, losses, strict=True)]
    out: dict[str, Any] = {
        "law": "L(N) = E + A * (N / N0) ** -alpha",
        "method": "least squares on the losses (scipy curve_fit, bounded), at a fixed tokens-per-parameter multiple",
        "E": e,
        "A": a,
        "alpha": alpha,
        "N0": n0,
        "rms_relative_residual": float(np.sqrt(np.mean(np.square(rel)))),
        "leave_one_out_relative_error": None,
    }
    if len(params) >= 4:
        errs = []
        for i in range(len(params)):
            ns = params[:i] + params[i + 1 :]
            ls = losses[:i] + losses[i + 1 :]
            ei, ai, al = fit(ns, ls)
            errs.append(abs(law(params[i], ei, ai, al) - losses[i]) / losses[i])
        out["leave_one_out_relative_error"] = float(np.mean(errs))
    return out


def predict(fit: dict[str, Any], n: int) -> float:
    return fit["E"] + fit["A"] * (n / fit["N0"]) ** -fit["alpha"]


def own_run_overrides(folder: Path) -> list[str]:
    """A proxy run's output and checkpoints in `folder`, resumed only from there. The config's `checkpoint.dir`
    and a `checkpoint.resume` folder are the main run's: inherited, every rung (or mixture run) saved into that
    one folder and resumed the one before it, and a rung retrained after a settings change kept the old
    checkpoints (only its own folder is cleared)."""
    from core.layout import RunPaths

    return [
        f"run.output_dir={folder}",
        f"checkpoint.dir={RunPaths(folder).checkpoints}",
        "checkpoint.resume=auto",
    ]


def rung_config_overrides(cfg: RunConfig, rung: Rung, root: Path) -> list[str]:
    """The rung's run: its own folder (its checkpoints there), its steps, the full held-out evaluation at its
    end."""
    warmup = cfg.schedule.warmup_fraction if cfg.schedule.warmup_fraction is not None else 0.05
    return [
        *rung.overrides,
        *own_run_overrides(root / rung.name),
        f"run.name={cfg.run.name}-{rung.name}",
        "schedule.budget_minutes=null",
        f"schedule.total_steps={rung.steps}",
        "schedule.warmup_steps=null",
        f"schedule.warmup_fraction={warmup}",
        f"checkpoint.every_steps={max(1, rung.steps // 4)}",
        f"eval.every_steps={rung.steps}",
        "finetune.tasks=[]",
    ]


def share_data(cfg: RunConfig, folder: Path) -> None:
    """The rung reads the run's token shards and tokenizer (links in its folder): the data stages run once."""
    from core.run_layout import RunLayout

    layout = RunLayout(cfg)
    if not (layout.tokens / "manifest.json").is_file():
        raise ConfigError(
            f"run.output_dir: no token shards at {layout.tokens} (tokens/manifest.json is missing): run "
            f"`python -m data_pipeline all --config <config>` once; every rung reads them"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in zip(SHARED_DATA, (layout.tokens, layout.tokenizer), strict=True):
        link = folder / name
        if not link.exists():
            link.symlink_to(target.resolve(), target_is_directory=True)


def final_eval_row(run_dir: Path) -> dict[str, Any]:
    """The run's last evaluation row (mixed and per-source held-out losses)."""
    from pretrain.run.plots import read_metrics

    rows = [r for r in read_metrics(run_dir / "logs" / "metrics.jsonl") if r.get("split") == "eval"]
    if not rows:
        raise LadderError(f"{run_dir}: the run finished without an evaluation row in logs/metrics.jsonl")
    return rows[-1]


def final_eval_loss(run_dir: Path) -> float:
    return float(final_eval_row(run_dir)["loss"])


def run_training(config: Path, overrides: list[str], folder: Path, nproc: int, what: str) -> None:
    """One proxy run of `pretrain train` (torchrun on this node), its output in folder/train.log; a run that
    fails stops the caller with the run's exit code, naming `what` and the log.

    Stopped as `launch run` stops: a SIGINT (Ctrl-C), SIGTERM or SIGUSR1 to this process is passed to the ranks,
    which checkpoint at the step end, and this waits for them, then stops with PREEMPTED (75): a rerun resumes
    that run from its checkpoint. torchrun has a session of its own so that a terminal's Ctrl-C reaches it only
    through here (torchrun itself would signal the ranks' process groups, DataLoader workers included); it gets
    SIGTERM if this process is SIGKILLed, so no rank trains on alone. Whether the ranks checkpointed at the
    signal is read in the checkpoint folder of the run's own resolved config (`checkpoint.dir` may lie outside
    `folder`), the folder its ranks save into."""
    from core.layout import RunPaths
    from core.net import free_port
    from core.process import dies_with_this_process, supervise

    checkpoints = RunPaths.from_config(load_config(config, overrides)).checkpoints
    log_file = folder / "train.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
        "-m",
        "pretrain",
        "train",
        "--config",
        str(config),
        *overrides,
    ]
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
            start_new_session=True,
            preexec_fn=dies_with_this_process(),
        )
        rc = supervise([proc], 1, checkpoints, name=what)
    if rc == PREEMPTED:
        raise LadderError(
            f"{what} stopped at a signal and checkpointed; rerun the same command to resume it (its log: {log_file})",
            exit_code=PREEMPTED,
        )
    if rc != 0:
        raise LadderError(f"{what} failed (exit {rc}); its log: {log_file}", exit_code=rc if rc > 0 else 1)


def train_rung(config: Path, overrides: list[str], rung: Rung, folder: Path, nproc: int) -> dict[str, Any]:
    """One rung's run, then its record."""
    log.info(
        f"[ladder] {rung.name}: {rung.params:,} non-embedding parameters, {rung.tokens:,} tokens, {rung.steps} steps"
    )
    run_training(config, overrides, folder, nproc, f"[ladder] rung {rung.name}")
    record = asdict(rung) | {"loss": final_eval_loss(folder), "overrides": overrides}
    atomic_write(folder / RUNG_FILE, json.dumps(record, indent=1) + "\n")
    return record


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _clear_outputs(folder: Path) -> None:
    """Everything a run left in `folder` (checkpoints, logs, records) but the links to the run's data stages that
    `share_data` made: those are the same whatever the settings, and the data stages run once."""
    for child in folder.iterdir():
        if child.name in SHARED_DATA:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def claim_folder(folder: Path, overrides: list[str], record: str, what: str) -> dict[str, Any] | None:
    """A proxy run's (a rung's, a mixture run's) finished record in `folder`, when it was made under `overrides`:
    the run is done and kept. Else None, with the folder ready to train in under `overrides`.

    The trainer resumes (`checkpoint.resume=auto`) whatever checkpoint it finds in the folder, so none may be
    left there from other settings (another mixture, another rung's batch and LR): it would continue another
    run, or be refused by it. Which settings the folder's outputs were made under is read from the finished
    record, else from STARTED_FILE, written here before every run, so that a run killed under other settings
    starts over too; a run killed under these settings resumes its own checkpoint. Outputs with neither file
    (left by a version that wrote no STARTED_FILE) are of unknown settings: started over."""
    rec = _read_json(folder / record)
    if rec is not None and rec.get("overrides") == overrides:
        return rec
    started = _read_json(folder / STARTED_FILE)
    why = None
    if rec is not None:
        why = "settings changed since it finished, trained again"
    elif started is not None:
        if started.get("overrides") != overrides:
            why = "stopped before it finished, under other settings: started over, not resumed"
    elif folder.is_dir() and any(c.name not in SHARED_DATA for c in folder.iterdir()):
        why = f"outputs of unknown settings in {folder} (no {STARTED_FILE}): started over"
    if why is not None:
        log.info(f"{what}: {why}")
        _clear_outputs(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / STARTED_FILE, json.dumps({"overrides": overrides}, indent=1) + "\n")
    return None


def check_memory(cfg: RunConfig, rungs: list[Rung], memory_gib: float | None) -> None:
    """Every rung within the memory of a rank (the plan's model states at the config's ZeRO stage and one
    micro-batch's activations), before any rung trains."""
    from pretrain.tools.plan import plan_report

    if memory_gib is None:
        import psutil

        memory_gib = psutil.virtual_memory().total / 2**30 / max(1, cfg.launch.procs_per_node)
    for r in rungs:
        rep = plan_report(sized_config(cfg, r))
        need = rep["memory_per_rank"][f"zero{cfg.deepspeed.zero_stage}"]["device_gib"]
        need += rep["activation_gib_per_rank"]
        if need > memory_gib:
            raise ConfigError(
                f"--rungs: rung {r.name} needs about {need:.3g} GiB per rank (model states at "
                f"deepspeed.zero_stage={cfg.deepspeed.zero_stage} and one micro-batch), more than the "
                f"{memory_gib:.3g} GiB a rank has here; drop it or give --memory-gib"
            )


def sized_config(cfg: RunConfig, rung: Rung) -> RunConfig:
    """The config as the rung's run will have it: the rung's own overrides applied to a copy and the whole of it
    validated (the rung is encoded once, in `Rung.overrides`). A shape the config refuses raises pydantic's
    ValidationError, which `make_rung` names with the rung."""
    data = to_dict(cfg)
    for keys, value in parse_overrides(rung.overrides):
        apply_override(data, keys, value)
    return RunConfig.model_validate(data)


def run_ladder(
    config: Path,
    overrides: list[str],
    rungs_spec: str,
    tokens_per_param: float = 20.0,
    predict_spec: str | None = None,
    memory_gib: float | None = None,
    hparams: str = "scaled",
) -> dict[str, Any]:
    """Trains every rung not yet done, fits the law, predicts the `predict_spec` rungs; returns the report."""
    cfg = load_config(config, overrides)
    if tokens_per_param <= 0:
        raise ConfigError(f"--tokens-per-param: {tokens_per_param} is not a positive multiple")
    if hparams not in HPARAMS:
        raise ConfigError(f"--hparams: '{hparams}' is not one of {', '.join(HPARAMS)}")
    anchor = anchor_of(cfg) if hparams == "scaled" else None
    rungs = [make_rung(cfg, w, d, tokens_per_param, anchor) for w, d in parse_rungs(rungs_spec)]
    if len({r.name for r in rungs}) != len(rungs):
        raise ConfigError(f"--rungs: a rung is listed twice in {rungs_spec}")
    targets = (
        [make_rung(cfg, w, d, tokens_per_param, anchor) for w, d in parse_rungs(predict_spec, "--predict")]
        if predict_spec
        else []
    )
    if len(rungs) < 3:
        raise ConfigError(f"--rungs: a fit with an irreducible term needs 3 rungs or more (got {len(rungs)})")
    check_memory(cfg, rungs, memory_gib)
    root = Path(cfg.run.root) / "ladder"
    records = []
    for rung in rungs:
        folder = root / rung.name
        rung_overrides = [*overrides, *rung_config_overrides(cfg, rung, root)]
        rec = claim_folder(folder, rung_overrides, RUNG_FILE, f"[ladder] {rung.name}")
        if rec is not None:
            log.info(f"[ladder] {rung.name}: done before (loss {rec['loss']:.4f}), kept")
        else:
            share_data(cfg, folder)
            rec = train_rung(config, rung_overrides, rung, folder, cfg.launch.procs_per_node)
        records.append(rec)
    fit = fit_power_law([r["params"] for r in records], [r["loss"] for r in records])
    report = {
        "tokens_per_param": tokens_per_param,
        "hparams": hparams if anchor is None else asdict(anchor) | {"rule": "scaled"},
        "rungs": records,
        "fit": fit,
        "predictions": [asdict(t) | {"predicted_loss": predict(fit, t.params)} for t in targets],
    }
    atomic_write(root / "ladder.json", json.dumps(report, indent=1) + "\n")
    atomic_write(root / "ladder.md", format_table(report) + "\n")
    report["plot"] = str(plot_ladder(report, root / "ladder.png"))
    return report


def format_table(report: dict[str, Any]) -> str:
    fit = report["fit"]
    lines = [
        "| rung | non-embedding params | tokens | steps | batch | peak LR | held-out loss | fit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def hp(r: dict[str, Any]) -> str:  # the batch and LR cells ("config": the config's own)
        lr = f"{r['lr']:.3g}" if r.get("lr") else "config"
        return f"{r.get('global_batch') or 'config'} | {lr} |"

    for r in report["rungs"]:
        lines.append(
            f"| {r['name']} | {r['params']:,} | {r['tokens']:,} | {r['steps']} | {hp(r)} {r['loss']:.4f} | "
            f"{predict(fit, r['params']):.4f} |"
        )
    for p in report["predictions"]:
        lines.append(
            f"| {p['name']} (predicted) | {p['params']:,} | {p['tokens']:,} | {p['steps']} | {hp(p)} | "
            f"{p['predicted_loss']:.4f} |"
        )
    loo = fit["leave_one_out_relative_error"]
    lines += [
        "",
        f"{fit['law']}: E={fit['E']:.4f}, A={fit['A']:.4f}, alpha={fit['alpha']:.4f}, N0={fit['N0']:,.0f}; "
        f"RMS relative residual {fit['rms_relative_residual']:.2%}"
        + (
            f", leave-one-out relative error {loo:.2%}" if loo is not None else " (3 rungs: no leave-one-out)"
        ),
    ]
    return "\n".join(lines)


def plot_ladder(report: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fit = report["fit"]
    ns = [r["params"] for r in report["rungs"]]
    ps = [p["params"] for p in report["predictions"]]
    grid = np.geomspace(min(ns) * 0.8, max(ns + ps) * 1.25, 100)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ns, [r["loss"] for r in report["rungs"]], "o", label="trained rungs")
    ax.plot(grid, [predict(fit, n) for n in grid], "-", label=f"fit: E + A (N/N0)^-{fit['alpha']:.3f}")
    if ps:
        ax.plot(ps, [p["predicted_loss"] for p in report["predictions"]], "x", ms=9, label="predicted")
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("held-out loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
