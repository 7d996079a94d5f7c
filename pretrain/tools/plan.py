"""`pretrain plan`: the batch plan, scaled LR/warmup, token budget, per-rank memory for each ZeRO stage,
activation memory, FLOPs per step and the time a step would take on a stated GPU, without starting training.

It imports neither torch, transformers nor DeepSpeed (a plan prints in about a second): parameter counts come
from the family's config-only count (pretrain/families/shapes.py; checked against a meta-device build in the
tests), and the ZeRO 2/3 estimates are DeepSpeed's own formulas, restated below.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any

from core.errors import CannotContinueError, ConfigError
from core.specs import training_flops_per_token
from pretrain.checkpoint import resume_diff
from pretrain.checkpoint.meta import complete_tags, read_complete
from pretrain.families.shapes import padded_vocab
from pretrain.run.schedule import make_plan
from runconfig import RunConfig

# Dense 16-bit tensor-core peaks (FLOP/s per GPU, vendor data sheets, no sparsity) for `plan --gpu`.
GPU_PEAKS = {
    "h100": 989e12, "h200": 989e12, "b200": 2250e12, "a100": 312e12, "l40s": 362e12, "a10g": 125e12,
    "v100": 125e12, "mi300x": 1307e12,
}  # fmt: skip
DEFAULT_GPU = "h100"
DEFAULT_MFU = 0.40  # a well-tuned dense transformer on H100s reaches 35-50 % (bench/mfu_gpu.py measures ours)


def check_plan_flags(cfg: RunConfig, world_size: int | None, gpu: str | None, mfu: float | None) -> None:
    """`plan`'s own flags checked like config keys, before any work: a ConfigError (one line, the flag and the
    values it takes) instead of a traceback from deep in the estimate, or a plan printed "at MFU 150%"."""
    if mfu is not None and not 0 < mfu <= 1:
        raise ConfigError(
            f"--mfu {mfu:g}: the assumed model FLOPs utilisation is a fraction in (0, 1] (e.g. 0.4 for 40%)"
        )
    if gpu is not None and gpu.lower() not in GPU_PEAKS:
        raise ConfigError(
            f"--gpu: unknown GPU '{gpu}' (known: {', '.join(sorted(GPU_PEAKS))}); or set logging.peak_flops "
            "and leave --gpu out"
        )
    if world_size is None:
        return
    if world_size < 1:
        raise ConfigError(f"--world-size {world_size}: a run needs at least 1 rank")
    try:
        cfg.batch_plan(world_size)
    except ValueError as e:
        per_rank = cfg.batch_plan(1)
        steps = per_rank["global_batch_size"] // per_rank["micro_batch_size"]
        fits = [str(n) for n in range(1, steps + 1) if steps % n == 0]
        raise ConfigError(
            f"--world-size {world_size}: {e}; world sizes that divide it: {', '.join(fits)}"
        ) from None


def expected_accelerator() -> str:
    """DeepSpeed's accelerator name without importing DeepSpeed (which costs seconds): DS_ACCELERATOR when set,
    as DeepSpeed reads it, else cuda where nvidia-smi exists, else cpu (what `make` exports too)."""
    return os.environ.get("DS_ACCELERATOR") or ("cuda" if shutil.which("nvidia-smi") else "cpu")


class _VocabOnly:
    """Stands in for a tokenizer that has not been trained yet: only its size and special ids matter here."""

    def __init__(self, n: int):
        self.n = n
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 1, 0, 2
        self.all_special_ids = [0, 1, 2]

    def __len__(self) -> int:
        return self.n


def param_counts(cfg: RunConfig) -> tuple[int, int]:
    """(total params, largest module's params) from the family's config-only count, else the meta-device build.
    The family's count covers its own objectives; one it carries by declaration (RTD on ModernBERT: a generator
    beside it, no MLM head) is counted on the module built."""
    family = cfg.model.spec
    count = family.param_count
    own = cfg.objective.type in family.objectives or cfg.objective.spec.trains is None
    return count(cfg) if count is not None and own else model_param_counts(cfg)


def model_param_counts(cfg: RunConfig) -> tuple[int, int]:
    """(total params, largest layer params), counted on the meta device (no memory allocated)."""
    model = meta_module(cfg)
    total = sum(dict((id(p), p.numel()) for p in model.parameters()).values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def meta_module(cfg: RunConfig) -> Any:
    """The module trained, with the objective's wrapper (ELECTRA's generator) if any, on the meta device (shapes
    only, no memory)."""
    # torch and transformers load lazily here on purpose: only `plan --exact`, families without a config-only count
    # and objectives that run a part twice need them, and importing them costs most of a plan's time.
    import torch

    from pretrain.objectives import wrap_model
    from pretrain.run.models import build_model

    tok = _VocabOnly(cfg.tokenizer.vocab_size)
    with torch.device("meta"):
        return wrap_model(cfg, build_model(cfg.model, tok, cfg.packing.seq_len), tok)


def _zero2(total: int, per_node: int, nodes: int, offload: bool, buffer: float = 1.5) -> tuple[float, float]:
    """(cpu, device) bytes: deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs."""
    gpus = nodes * per_node
    if offload:
        return total * max(4 * gpus, 16) * buffer, 2 * total
    return total * 4 * per_node * buffer, 2 * total + int(18 * total / gpus)


def _zero3(
    total: int,
    largest: int,
    per_node: int,
    nodes: int,
    offload: bool,
    offload_params: bool,
    buffer: float = 1.5,
) -> tuple[float, float]:
    """(cpu, device) bytes: deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs (zero_init)."""
    gpus, layer = nodes * per_node, 4 * largest
    if offload and offload_params:
        return total * 18 / nodes * buffer, layer
    if offload:
        return total * 16 / nodes * buffer, layer + int(2 * total / gpus)
    return largest * 4 * per_node * buffer, layer + int(18 * total / gpus)


def memory_estimates(cfg: RunConfig, total: int, largest: int, world: int) -> dict[str, dict[str, float]]:
    """GiB per rank for model states (params, grads, optimizer). Stages 2 and 3 follow DeepSpeed's estimators;
    DeepSpeed has none for stages 0/1, so those use the ZeRO paper's formula (2+2+12 bytes/param mixed
    precision, optimizer states partitioned in stage 1)."""
    gib = 2**30
    nodes = cfg.launch.nodes
    per_node = max(1, world // nodes)
    ds = cfg.deepspeed
    out: dict[str, dict[str, float]] = {
        "zero0": {"device_gib": 16 * total / gib, "cpu_gib": 0.0},
        "zero1": {"device_gib": (4 * total + 12 * total / world) / gib, "cpu_gib": 0.0},
    }
    cpu, dev = _zero2(total, per_node, nodes, ds.offload_optimizer)
    out["zero2"] = {"device_gib": dev / gib, "cpu_gib": cpu / gib / per_node}
    cpu, dev = _zero3(total, largest, per_node, nodes, ds.offload_optimizer, ds.offload_params)
    out["zero3"] = {"device_gib": dev / gib, "cpu_gib": cpu / gib / per_node}
    return out


def activation_gib(cfg: RunConfig, micro_batch: int, vocab: int) -> float:
    """Activation memory per rank for one micro-batch, GiB: s*b*h*(34 + 5*a*s/h) bytes per layer with 16-bit
    activations and no recomputation (Korthikanti et al. 2022, eq. 2; twice that in fp32; with activation
    checkpointing only each layer's input, 2*s*b*h, is kept), plus the fp32 logits (4*s*b*V; one chunk of them
    with objective.chunked_loss)."""
    m, s, b = cfg.model, cfg.packing.seq_len, micro_batch
    spec = m.spec
    layers = m.num_layers + ((m.num_decoder_layers or m.num_layers) if spec.encoder_decoder else 0)
    width = 2 if cfg.deepspeed.precision in ("bf16", "fp16") else 4
    per_layer = s * b * m.hidden_size * (34 + 5 * m.num_heads * s / m.hidden_size) * width / 2
    if cfg.deepspeed.activation_checkpointing:
        per_layer = 2 * s * b * m.hidden_size * width / 2
    logits = 4 * s * b * vocab
    if (
        cfg.objective.chunked_loss
    ):  # one chunk of fp32 logits and its gradient at a time (pretrain/objectives/losses.py)
        from pretrain.objectives.losses import MAX_CHUNK_ELEMENTS

        logits = min(logits, 2 * 4 * MAX_CHUNK_ELEMENTS)
    return (layers * per_layer + logits) / 2**30


def config_flops_per_token(cfg: RunConfig, total: int | None = None) -> float:
    """Training FLOPs per token from the config alone (`total`: its parameter count, if already known), as the
    trainer counts them (pretrain.run.metrics.flops_per_token): an untied causal LM's input embedding is a lookup."""
    spec, m = cfg.model.spec, cfg.model
    total = param_counts(cfg)[0] if total is None else total
    untied = 0 if m.tie_word_embeddings or spec.task != "causal_lm" else padded_vocab(cfg) * m.hidden_size
    rerun = cfg.objective.spec.rerun  # built on the meta device only for an objective that runs a part twice
    again = (0, 0.0) if rerun is None else rerun(cfg, meta_module(cfg))
    return training_flops_per_token(spec, m, total - untied, cfg.packing.seq_len, again)


def step_estimate(cfg: RunConfig, plan: Any, total: int, gpu: str | None, mfu: float) -> dict[str, Any]:
    """FLOPs per optimizer step (the family's FLOPs/token x tokens per step) and the time it takes on `gpu` at
    the assumed MFU; logging.peak_flops, when set, is the peak instead of the GPU table's. A CPU (gloo) config
    without either gets no time: an H100's would be off by orders of magnitude."""
    fpt = config_flops_per_token(cfg, total)
    flops = fpt * plan.tokens_per_step
    name = (gpu or DEFAULT_GPU).lower()
    if cfg.logging.peak_flops and gpu is None:
        peak, source = float(cfg.logging.peak_flops), "logging.peak_flops"
    elif gpu is None and cfg.launch.backend == "gloo":  # a CPU run: no GPU's peak is its speed
        return {
            "flops_per_token": fpt,
            "flops_per_step": flops,
            "peak_flops_per_rank": None,
            "peak_source": "a CPU (gloo) config has no published peak: give --gpu NAME or logging.peak_flops",
            "mfu_assumed": mfu,
            "seconds_per_step": None,
            "total_hours": None,
        }
    elif name in GPU_PEAKS:
        peak, source = GPU_PEAKS[name], f"{name} dense 16-bit peak"
    else:
        raise ValueError(
            f"plan --gpu: unknown GPU '{gpu}' (known: {', '.join(sorted(GPU_PEAKS))}); "
            "or set logging.peak_flops"
        )
    seconds = flops / (peak * plan.world_size * mfu)
    return {
        "flops_per_token": fpt,
        "flops_per_step": flops,
        "peak_flops_per_rank": peak,
        "peak_source": source,
        "mfu_assumed": mfu,
        "seconds_per_step": seconds,
        "total_hours": seconds * plan.total_steps / 3600 if plan.total_steps else None,
    }


def describe_parametrization(m: Any) -> str:
    """The plan's line for the parametrization: μP's base width and multipliers (pretrain/run/mup.py applies them)."""
    if m.parametrization != "mup":
        return "sp (the family's own)"
    w = m.width_mult
    return (
        f"mup: base width {m.mup_base_width}, width {m.hidden_size} (m = {w:g}): hidden init std x "
        f"{1 / math.sqrt(w):.3g}, hidden LR x {1 / w:.3g}, logits x {1 / w:.3g}, attention 1/head_dim"
    )


def plan_report(
    cfg: RunConfig,
    world_size: int | None = None,
    gpu: str | None = None,
    mfu: float = DEFAULT_MFU,
    exact: bool = False,
) -> dict[str, Any]:
    from pretrain.run.lr_scaling import explain

    plan = make_plan(cfg, world_size)
    total, largest = model_param_counts(cfg) if exact else param_counts(cfg)
    vocab = -(-cfg.tokenizer.vocab_size // cfg.model.vocab_pad_multiple) * cfg.model.vocab_pad_multiple
    lines, warnings = explain(cfg, plan.global_batch_size, plan.peak_lr, plan.warmup_steps)
    return {
        "lr_scaling": lines,
        "warnings": warnings,
        "plan": plan.__dict__ | {"tokens_per_step": plan.tokens_per_step, "total_tokens": plan.total_tokens},
        "params": total,
        "largest_layer_params": largest,
        "memory_per_rank": memory_estimates(cfg, total, largest, plan.world_size),
        "activation_gib_per_rank": activation_gib(cfg, plan.micro_batch_size, vocab),
        "step": step_estimate(cfg, plan, total, gpu, mfu),
        "resume": resume_preview(cfg),
        "parametrization": describe_parametrization(cfg.model),
    }


def format_report(r: dict[str, Any]) -> str:
    p = r["plan"]
    lines = [
        f"world size        {p['world_size']}",
        f"micro-batch       {p['micro_batch_size']} sequences/rank",
        f"grad accumulation {p['grad_accum']}",
        f"global batch      {p['global_batch_size']} sequences = {p['tokens_per_step']:,} tokens",
        f"peak LR           {p['peak_lr']:.3g} (rule: {p['lr_rule']})",
        f"schedule          {p['phases']}",
        f"parametrization   {r['parametrization']}",
        *(
            [f"warmup            {p['warmup_steps']} of {p['total_steps']} steps"]
            if p["total_steps"] is not None
            else [
                f"time budget       {p['budget_s'] / 60:g} min, warmup {p['warmup_fraction']:.0%} of it (LR follows the clock)"
            ]
        ),
        *r["lr_scaling"],
        *r["warnings"],
        *([f"total tokens      {p['total_tokens']:,}"] if p["total_steps"] is not None else []),
        f"parameters        {r['params']:,} (largest layer {r['largest_layer_params']:,})",
        "model-state memory per rank (GiB):",
    ]
    for stage, m in r["memory_per_rank"].items():
        lines.append(f"  {stage:<6} device {m['device_gib']:8.2f}   cpu {m['cpu_gib']:8.2f}")
    st = r["step"]
    total_h = f", {st['total_hours']:.1f} h for the run" if st["total_hours"] is not None else ""
    lines += [
        f"activations       {r['activation_gib_per_rank']:.2f} GiB per rank per micro-batch (Korthikanti et al. "
        "2022, + fp32 logits)",
        f"FLOPs per step    {st['flops_per_step']:.3g} ({st['flops_per_token']:.3g} per token)",
        f"time per step     {st['seconds_per_step']:.3g} s{total_h}, assuming {st['peak_flops_per_rank'] / 1e12:g} "
        f"TFLOP/s per rank ({st['peak_source']}) at MFU {st['mfu_assumed']:.0%} (--gpu, --mfu)"
        if st["seconds_per_step"] is not None
        else f"time per step     not estimated: {st['peak_source']}",
    ]
    lines += format_resume_preview(r.get("resume"))
    return "\n".join(lines)


def resume_preview(cfg) -> dict[str, Any] | None:
    """What `train` would resume from and which config changes it would apply or refuse (for `plan`: what it
    prints is what runs). Reads COMPLETE only; the files are verified by `train` itself."""
    from pathlib import Path

    from runconfig.load import to_dict

    resume = cfg.checkpoint.resume
    if resume == "none":
        return None
    if resume == "auto":
        ckpt_dir = Path(cfg.checkpoint_dir)
        tags = complete_tags(ckpt_dir)
        if not tags:
            return None
        folder = ckpt_dir / tags[-1]
    else:
        folder = Path(resume)
    meta = read_complete(folder.parent, folder.name)
    out: dict[str, Any] = {"checkpoint": str(folder), "step": meta["step"]}
    try:
        ch = resume_diff.compare(
            meta.get("config"),
            to_dict(cfg),
            meta["step"],
            accept=True,
            reset_data_order=cfg.checkpoint.reset_data_order,
        )
    except CannotContinueError as e:
        return out | {"error": str(e)}
    return out | {
        "data_order": [[k, a, b] for k, a, b in ch.data_order],
        "applied": [[k, a, b] for k, a, b in ch.applied],
        "refused": [[k, a, b] for k, a, b in ch.refused],
        "accepted": bool(cfg.checkpoint.accept_config_changes),
    }


def format_resume_preview(p: dict[str, Any] | None) -> list[str]:
    if p is None:
        return ["resume            none (a fresh run)"]
    lines = [f"resume            from {p['checkpoint']} at step {p['step']}"]
    if "error" in p:
        return lines + [f"  stops: {p['error']}"]
    lines += [f"  data order reset: {k}: {a!r} -> {b!r}" for k, a, b in p.get("data_order", [])]
    lines += [f"  applied: {k}: {a!r} -> {b!r}{resume_diff.note(k)}" for k, a, b in p["applied"]]
    verdict = "accepted" if p["accepted"] else f"the run stops unless {resume_diff.ACCEPT_FLAG}"
    lines += [f"  refused ({verdict}): {k}: {a!r} -> {b!r}" for k, a, b in p["refused"]]
    return lines
