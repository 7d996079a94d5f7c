"""`python -m pretrain mixture`: which `data.sources` weights to train on, decided by small proxy runs, in the
manner of RegMix (Liu et al. 2024).

The search trains `--runs` small runs of the config from the run's own token shards and tokenizer (the data
stages run once), each at a mixture drawn from a flat Dirichlet over the sources (the first run is the uniform
mixture), into `<run>/mixture/run<k>/`. Each run's last evaluation gives one held-out loss per source (the
loader's held-out blocks of that source, the same blocks whatever the mixture). Each source's loss is fitted as
a quadratic in the weights (least squares with a small ridge; RegMix fits LightGBM, which needs far more runs
than a CPU search makes), and the fit predicts the target, the held-out mixed loss: the plain mean over sources
of their held-out losses, which no mixture can lower by ignoring a source. The proposal is the mean of the 100
best of 100,000 sampled mixtures (RegMix's top-k average, steadier than one argmin), with its predicted loss.

The weights are shares of the data (`loader.mixing: proportion` in every proxy run: under the default `scale` a
weight multiplies a source's own size, and a mixture over sources of unequal size would not be the one fitted).
No mixture, sampled or proposed, repeats a source more than `--max-epochs` times in the runs' tokens (4 by default:
Muennighoff et al. 2023 found up to about 4 passes over the same data nearly as good as fresh data): a source of
a few documents is capped at the share those passes fill, or a search would find that memorising it lowers its own
held-out loss. A share cap the sources cannot fill together is refused.

A finished run is kept (`run.json`); a killed search reruns only the others, an unfinished run from its own latest
checkpoint. A run whose overrides changed since (another `--seed`'s mixture, `--steps`, a config override), finished
or not, starts over in a cleared folder. A search over one source is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigError
from core.io import atomic_write
from core.log import get_logger
from runconfig import RunConfig, load_config

log = get_logger(__name__)

RUN_FILE = "run.json"
RIDGE = 1e-3
SAMPLES = 100_000
TOP = 100
MIN_WEIGHT = 0.01  # data.sources[].weight must be positive


def capped(w: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Each row of mixtures moved onto {sum 1, w <= cap}: a share above its cap is cut to it and the excess spread
    over the sources below their caps in proportion to their shares (water-filling); needs cap.sum() >= 1."""
    w = w / w.sum(axis=1, keepdims=True)
    for _ in range(len(cap) + 1):
        over = w > cap
        if not over.any():
            break
        excess = np.where(over, w - cap, 0.0).sum(axis=1, keepdims=True)
        w = np.minimum(w, cap)
        room = np.where(w < cap, w, 0.0)
        share = np.where(
            room.sum(axis=1, keepdims=True) > 0, room / room.sum(axis=1, keepdims=True).clip(1e-300), 0
        )
        w = w + excess * share
    return w


def sample_mixtures(k: int, n: int, seed: int, cap: np.ndarray | None = None) -> np.ndarray:
    """n mixtures over k sources: the uniform one, then flat-Dirichlet draws (floored at MIN_WEIGHT, or at half a
    source's cap where that is lower), each within the share caps."""
    cap = np.ones(k) if cap is None else cap
    rng = np.random.default_rng(seed)
    floor = np.minimum(MIN_WEIGHT, cap / 2)
    draws = np.maximum(rng.dirichlet(np.ones(k), size=max(0, n - 1)), floor)
    out = np.vstack([np.full((1, k), 1.0 / k), draws])[:n]
    return capped(out, cap)


def share_caps(cfg: RunConfig, steps: int | None, max_epochs: float) -> tuple[np.ndarray, dict[str, Any]]:
    """The largest share of each source that `max_epochs` passes over its training samples fill in a run of
    `steps` steps (default: the config's), and what they were computed from."""
    from data_pipeline.loader import PretrainLoader

    total = steps or cfg.schedule.steps
    names = [s.name for s in cfg.data.sources]
    if not total:
        raise ConfigError(
            "pretrain mixture: a time-budgeted config needs --steps (the share caps need the runs' samples)"
        )
    stats = PretrainLoader(cfg, 0, 1, collate_fn=lambda x: x).stats()
    samples = {n: stats[n]["split_samples"] for n in names}
    read = total * cfg.batch_plan()["global_batch_size"]
    cap = np.array([min(1.0, max_epochs * samples[n] / read) for n in names])
    info = {"max_epochs": max_epochs, "samples_read": read, "train_samples": samples}
    if cap.sum() < 1:
        raise ConfigError(
            f"--max-epochs {max_epochs:g}: runs of {total} steps read {read:,} samples, and {max_epochs:g} passes over "
            f"the sources' training samples ({samples}) fill only {cap.sum():.0%} of them; raise --max-epochs, "
            "train fewer --steps, or add data"
        )
    return cap, info


def _features(w: np.ndarray) -> np.ndarray:
    return np.hstack([np.ones((len(w), 1)), w, w**2])


def fit_losses(weights: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """Coefficients (features x sources) of each source's held-out loss as a quadratic in the weights."""
    x = _features(weights)
    return np.linalg.solve(x.T @ x + RIDGE * np.eye(x.shape[1]), x.T @ losses)


def predict(coef: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Predicted held-out mixed loss (mean over sources) of each mixture."""
    return (_features(weights) @ coef).mean(axis=1)


def propose(coef: np.ndarray, k: int, seed: int, cap: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """The mean of the TOP best of SAMPLES mixtures (within the caps) by predicted loss, and its own predicted
    loss (a mean of points within the caps is within them)."""
    cand = sample_mixtures(k, SAMPLES, seed + 1, cap)
    best = cand[np.argsort(predict(coef, cand))[:TOP]].mean(axis=0)
    best = best / best.sum()
    return best, float(predict(coef, best[None, :])[0])


def mixture_overrides(cfg: RunConfig, weights: np.ndarray, folder: Path, steps: int | None) -> list[str]:
    """The proxy run at `weights`: its own folder (its checkpoints there, so no run resumes another's mixture),
    its steps, one evaluation at its end."""
    from pretrain.tools.ladder import own_run_overrides

    over = [f"data.sources.{i}.weight={w:.6f}" for i, w in enumerate(weights)]
    over += ["loader.mixing=proportion"]  # the weights are shares of the data, as they were fitted
    over += [*own_run_overrides(folder), f"run.name={cfg.run.name}-{folder.name}", "finetune.tasks=[]"]
    if steps is not None:
        over += ["schedule.budget_minutes=null", f"schedule.total_steps={steps}"]
    total = steps or cfg.schedule.steps
    if total:
        over += [f"eval.every_steps={total}", f"checkpoint.every_steps={max(1, total // 2)}"]
    return over


def _run_once(
    config: Path,
    overrides: list[str],
    cfg: RunConfig,
    k: int,
    weights: np.ndarray,
    root: Path,
    steps: int | None,
) -> dict[str, Any]:
    """Proxy run k at `weights` and its record: kept when it finished under the same overrides; else trained in
    its folder, cleared first of a run under other overrides (another --seed's mixture, another config override), whose
    checkpoints the trainer's auto-resume would otherwise continue."""
    from pretrain.tools.ladder import claim_folder, final_eval_row, run_training, share_data

    folder = root / f"run{k}"
    over = [*overrides, *mixture_overrides(cfg, weights, folder, steps)]
    rec = claim_folder(folder, over, RUN_FILE, f"[mixture] run{k}")
    if rec is not None:
        log.info(f"[mixture] run{k}: done before, kept")
        return rec
    share_data(cfg, folder)
    log.info(
        f"[mixture] run{k}: weights "
        + ", ".join(f"{s.name} {w:.3f}" for s, w in zip(cfg.data.sources, weights, strict=True))
    )
    run_training(config, over, folder, cfg.launch.procs_per_node, f"[mixture] run{k}")
    row = final_eval_row(folder)
    missing = [s.name for s in cfg.data.sources if f"loss/{s.name}" not in row]
    if missing:
        raise ConfigError(
            f"[mixture] run{k}: no held-out loss for source(s) {missing} (loader.eval_fraction too small?)"
        )
    rec = {
        "weights": [float(w) for w in weights],
        "losses": {s.name: float(row[f"loss/{s.name}"]) for s in cfg.data.sources},
        "overrides": over,
    }
    atomic_write(folder / RUN_FILE, json.dumps(rec, indent=1) + "\n")
    return rec


def run_mixture(
    config: Path,
    overrides: list[str],
    runs: int = 8,
    steps: int | None = None,
    seed: int = 0,
    max_epochs: float = 4.0,
) -> dict[str, Any]:
    """Trains the proxy runs not yet done, fits, proposes; writes mixture.json and mixture.md; returns the report."""
    cfg = load_config(config, overrides)
    names = [s.name for s in cfg.data.sources]
    k = len(names)
    if k < 2:
        raise ConfigError(
            f"data.sources: a mixture search needs 2 sources or more (the config has {k}: {names})"
        )
    need = 2 * k + 2
    if runs < need:
        raise ConfigError(f"--runs {runs}: the fit over {k} sources needs {need} runs or more")
    if not max_epochs > 0:
        raise ConfigError(f"--max-epochs {max_epochs:g}: must be > 0")
    cap, caps_from = share_caps(cfg, steps, max_epochs)
    root = Path(cfg.run.root) / "mixture"
    mixtures = sample_mixtures(k, runs, seed, cap)
    records = [_run_once(config, overrides, cfg, i, w, root, steps) for i, w in enumerate(mixtures)]
    weights = np.array([r["weights"] for r in records])
    losses = np.array([[r["losses"][n] for n in names] for r in records])
    coef = fit_losses(weights, losses)
    fitted = predict(coef, weights)
    measured = losses.mean(axis=1)
    best, predicted = propose(coef, k, seed, cap)
    report = {
        "sources": names,
        "target": "held-out mixed loss: the mean over sources of each source's held-out loss",
        "fit": "each source's loss = quadratic in the weights, least squares with ridge "
        f"{RIDGE:g}; proposal = mean of the {TOP} best of {SAMPLES:,} sampled mixtures",
        "runs": [
            r | {"mixed_loss": float(m), "fitted": float(f)}
            for r, m, f in zip(records, measured, fitted, strict=True)
        ],
        "rms_fit_error": float(np.sqrt(np.mean((fitted - measured) ** 2))),
        "share_caps": dict(zip(names, map(float, cap), strict=True)) | {"from": caps_from},
        "proposal": {
            "weights": dict(zip(names, map(float, best), strict=True)),
            "predicted_mixed_loss": predicted,
        },
        # run0: the uniform mixture (within the caps)
        "uniform_measured_mixed_loss": float(measured[0]),
    }
    atomic_write(root / "mixture.json", json.dumps(report, indent=1) + "\n")
    atomic_write(root / "mixture.md", format_table(report) + "\n")
    return report


def format_table(report: dict[str, Any]) -> str:
    names = report["sources"]
    lines = [
        "| run | "
        + " | ".join(f"w {n}" for n in names)
        + " | "
        + " | ".join(f"loss {n}" for n in names)
        + " | mixed | fitted |",
        "|---|" + "---:|" * (2 * len(names) + 2),
    ]
    for i, r in enumerate(report["runs"]):
        cells = [f"{w:.3f}" for w in r["weights"]] + [f"{r['losses'][n]:.4f}" for n in names]
        lines.append(f"| run{i} | " + " | ".join(cells) + f" | {r['mixed_loss']:.4f} | {r['fitted']:.4f} |")
    p = report["proposal"]
    lines += [
        "",
        "proposed: "
        + ", ".join(f"{n} {w:.3f}" for n, w in p["weights"].items())
        + f"; predicted held-out mixed loss {p['predicted_mixed_loss']:.4f} (uniform, measured: "
        f"{report['uniform_measured_mixed_loss']:.4f}); RMS fit error {report['rms_fit_error']:.4f}",
    ]
    return "\n".join(lines)
