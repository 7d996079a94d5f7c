"""`pretrain plan`: the batch plan, scaled LR/warmup, token budget and per-rank memory for each ZeRO stage,
without starting training."""

from __future__ import annotations

from typing import Any

import torch

from pretrain import resume_diff
from pretrain.schedule import make_plan
from runconfig import RunConfig


class _VocabOnly:
    """Stands in for a tokenizer that has not been trained yet: only its size and special ids matter here."""

    def __init__(self, n: int):
        self.n = n
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 1, 0, 2
        self.all_special_ids = [0, 1, 2]

    def __len__(self) -> int:
        return self.n


def model_param_counts(cfg: RunConfig) -> tuple[int, int]:
    """(total params, largest layer params), counted on the meta device (no memory allocated)."""
    from pretrain.models import build_model
    from pretrain.objectives import wrap_model

    tok = _VocabOnly(cfg.tokenizer.vocab_size)
    with torch.device("meta"):  # the module trained: with the objective's wrapper (ELECTRA's generator) if any
        model = wrap_model(cfg, build_model(cfg.model, tok, cfg.packing.seq_len), tok)
    total = sum(dict((id(p), p.numel()) for p in model.parameters()).values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def memory_estimates(cfg: RunConfig, total: int, largest: int, world: int) -> dict[str, dict[str, float]]:
    """GiB per rank for model states (params, grads, optimizer). Stages 2 and 3 use DeepSpeed's estimators;
    DeepSpeed has none for stages 0/1, so those use the ZeRO paper's formula (2+2+12 bytes/param mixed
    precision, optimizer states partitioned in stage 1)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    gib = 2**30
    nodes = cfg.launch.nodes
    per_node = max(1, world // nodes)
    out: dict[str, dict[str, float]] = {
        "zero0": {"device_gib": 16 * total / gib, "cpu_gib": 0.0},
        "zero1": {"device_gib": (4 * total + 12 * total / world) / gib, "cpu_gib": 0.0},
    }
    cpu, dev = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=cfg.deepspeed.offload_optimizer)
    out["zero2"] = {"device_gib": dev / gib, "cpu_gib": cpu / gib / per_node}
    cpu, dev, _ = estimate_zero3_model_states_mem_needs(
        total, largest, per_node, nodes, cpu_offload=cfg.deepspeed.offload_optimizer,
        cpu_offload_params=cfg.deepspeed.offload_params,
    )
    out["zero3"] = {"device_gib": dev / gib, "cpu_gib": cpu / gib / per_node}
    return out


def plan_report(cfg: RunConfig, world_size: int | None = None) -> dict[str, Any]:
    from pretrain.lr_scaling import explain

    plan = make_plan(cfg, world_size)
    total, largest = model_param_counts(cfg)
    lines, warnings = explain(cfg, plan.global_batch_size, plan.peak_lr, plan.warmup_steps)
    return {
        "lr_scaling": lines,
        "warnings": warnings,
        "plan": plan.__dict__ | {"tokens_per_step": plan.tokens_per_step, "total_tokens": plan.total_tokens},
        "params": total,
        "largest_layer_params": largest,
        "memory_per_rank": memory_estimates(cfg, total, largest, plan.world_size),
        "resume": resume_diff.preview(cfg),
    }


def format_report(r: dict[str, Any]) -> str:
    p = r["plan"]
    lines = [
        f"world size        {p['world_size']}",
        f"micro-batch       {p['micro_batch_size']} sequences/rank",
        f"grad accumulation {p['grad_accum']}",
        f"global batch      {p['global_batch_size']} sequences = {p['tokens_per_step']:,} tokens",
        f"peak LR           {p['peak_lr']:.3g} (rule: {p['lr_rule']})",
        *([f"warmup            {p['warmup_steps']} of {p['total_steps']} steps"] if p["total_steps"] is not None else
          [f"time budget       {p['budget_s'] / 60:g} min, warmup {p['warmup_fraction']:.0%} of it (LR follows the clock)"]),
        *r["lr_scaling"],
        *r["warnings"],
        *([f"total tokens      {p['total_tokens']:,}"] if p["total_steps"] is not None else []),
        f"parameters        {r['params']:,} (largest layer {r['largest_layer_params']:,})",
        "model-state memory per rank (GiB):",
    ]
    for stage, m in r["memory_per_rank"].items():
        lines.append(f"  {stage:<6} device {m['device_gib']:8.2f}   cpu {m['cpu_gib']:8.2f}")
    lines += resume_diff.format_preview(r.get("resume"))
    return "\n".join(lines)
