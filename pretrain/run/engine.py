"""DeepSpeed from our config: process group (with our timeout), the generated ds_config, initialize.

The ds_config is always generated from the run YAML, never hand-edited, so the two cannot disagree; the
generated dict is written next to the checkpoints for inspection.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch

from core.layout import RunPaths
from core.log import get_logger
from core.net import free_port
from pretrain.run import mup
from pretrain.run.models import compile_blocks
from pretrain.run.schedule import TrainPlan, lr_multiplier
from pretrain.run.watchdog import flight_recorder_env
from runconfig import RunConfig

log = get_logger(__name__)


def accelerator_name() -> str:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name()


def rank_device() -> torch.device:
    """This rank's accelerator device (the one DeepSpeed's engine will take), known before the engine exists."""
    name = accelerator_name()
    return torch.device(name) if name == "cpu" else torch.device(name, int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(cfg: RunConfig) -> tuple[int, int]:
    """Start the process group with our collective timeout, applied to every group DeepSpeed creates later.

    ZeRO builds its data-parallel group with `dist.new_group()`, which takes torch's default timeout (30 min),
    not the one given to init: a frozen peer would hang the survivors. Patching the default first makes every
    group time out after `deepspeed.comm_timeout_s`.
    """
    import deepspeed
    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(seconds=cfg.deepspeed.comm_timeout_s)
    c10d.default_pg_timeout = timeout
    try:
        import deepspeed.comm.comm as ds_comm
        import deepspeed.constants as ds_constants

        ds_constants.default_pg_timeout = timeout
        ds_comm.default_pg_timeout = timeout
    except ImportError:  # older DeepSpeed layouts
        pass
    if "RANK" not in os.environ:  # plain `python -m pretrain train`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        # No peer has to find this store, so a fixed port only makes two single-process runs on one machine
        # collide (EADDRINUSE): take a free one unless the user named one.
        port = cfg.launch.master_port
        os.environ.setdefault("MASTER_PORT", str(free_port() if port is None else port))
    backend = cfg.launch.backend if accelerator_name() != "cpu" else "gloo"
    if accelerator_name() == "cpu":
        _skip_shm_op()
    _import_deepspeed_muon_eagerly()
    if backend == "nccl":  # torch's flight recorder: the last collectives of each rank, dumped on a hang
        flight_recorder_env(RunPaths(cfg.run.root).hang)
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout, verbose=False)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _skip_shm_op() -> None:
    """Start without DeepSpeed's CPU shared-memory all-reduce op (it serves inference_all_reduce only; training
    never calls it).

    DeepSpeed JIT-builds that op at every init, under torch's file lock in ~/.cache/torch_extensions: each rank
    start on the machine waited for the others' ninja runs (84 s measured on a loaded 2-core machine), and a
    rank SIGKILLed while holding the lock left it behind, after which every DeepSpeed start on the machine
    waited forever in FileBaton.wait (no CPU, no output)."""
    import importlib

    # importlib: `import deepspeed.comm.torch as m` binds deepspeed.comm's attribute `torch`, which is torch itself.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def _import_deepspeed_muon_eagerly() -> None:
    """Import DeepSpeed's Muon module with its kernels left eager, before DeepSpeed imports it.

    DeepSpeed 0.19 imports its Muon module at every ZeRO start (the optimizer check, the ZeRO-1/2 reduction, the
    bf16 and stage-3 optimizers), only to test `isinstance(optimizer, MuonWithAuxAdam)`. Its `@torch.compile`
    decorators load torch's inductor at import: 1.6 s of CPU per rank at every start (measured on 2 cores), while
    lmstack never builds a Muon optimizer. torch.compile returns the function unchanged while dynamo is disabled,
    so the module is imported once that way; the variable is read at the call only, and is put back at once."""
    import importlib
    import sys

    name = "deepspeed.runtime.zero.muon.muon_optimizer"
    if name in sys.modules:
        return
    before = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        importlib.import_module(name)
    finally:
        if before is None:
            del os.environ["TORCHDYNAMO_DISABLE"]
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = before


def build_ds_config(cfg: RunConfig, plan: TrainPlan, load_universal: bool = False) -> dict[str, Any]:
    """The lean step: no throughput-timer syncs, no bf16 overflow scan (StepGuard skips a bad step on the device
    instead), and `overlap_comm` only where a reduction crosses ranks (a world of one has nothing to overlap and
    would still pay the epilogue's `synchronize()`)."""
    ds = cfg.deepspeed
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.zero_stage >= 1:
        zero.update(
            contiguous_gradients=True,
            overlap_comm=accelerator_name() != "cpu" and plan.world_size > 1,
            reduce_scatter=True,
            reduce_bucket_size=int(5e7),
            allgather_bucket_size=int(5e7),
        )
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": accelerator_name() != "cpu"}
    if ds.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": accelerator_name() != "cpu"}
    if ds.zero_stage == 3:
        # Export gathers from the sharded checkpoint with zero_to_fp32, never on one GPU.
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    conf: dict[str, Any] = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # the throughput timer synchronizes the device before every forward and after every step (its default)
        "timers": {"throughput": {"enabled": False, "synchronized": False}},
        # every rank's tag is tag_for(the step StepSync agrees on): DeepSpeed's check of it (two all-reduces and
        # a device read on the saving step) cannot fail
        "checkpoint": {"load_universal": load_universal, "tag_validation": "Ignore"},
    }
    if ds.precision == "bf16":
        # bf16 needs no loss scaling: the per-tensor overflow scan (hundreds of kernels and an .item() per step)
        # is replaced by StepGuard (a non-finite loss or gradient norm skips the step on the device)
        conf["bf16"] = {"enabled": True, "check_grad_overflow": False}
    elif ds.precision == "fp16":
        conf["fp16"] = {
            "enabled": True,
            "loss_scale": 0,  # dynamic
            "initial_scale_power": ds.initial_loss_scale_power,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    if _use_ds_optimizer(cfg):
        name = {"adamw": "AdamW", "lamb": "Lamb"}[cfg.optim.name]
        params: dict[str, Any] = {
            "lr": plan.peak_lr,
            "betas": list(cfg.optim.betas),
            "eps": cfg.optim.eps,
            "weight_decay": cfg.optim.weight_decay,
        }
        conf["optimizer"] = {"type": name, "params": params}
    if ds.offload_optimizer and not _use_ds_optimizer(cfg):
        conf["zero_force_ds_cpu_optimizer"] = False
    return conf


def _use_ds_optimizer(cfg: RunConfig) -> bool:
    """DeepSpeed's own optimizers only where they are needed: FusedLamb for LAMB, DeepSpeedCPUAdam for optimizer
    offload on an accelerator. AdamW otherwise comes from torch (fused on CUDA), which needs no JIT-compiled ops
    (FusedAdam would need nvcc on every node)."""
    return cfg.optim.name == "lamb" or (cfg.deepspeed.offload_optimizer and accelerator_name() != "cpu")


def _param_groups(
    model: torch.nn.Module, weight_decay: float, lr: float, lr_scales: dict[int, float] | None = None
) -> list[dict[str, Any]]:
    """No weight decay on biases and LayerNorm weights (BERT/RoBERTa practice); under μP the hidden weights get
    their own group at their scaled LR (pretrain/run/mup.py `lr_scales`), which the schedule multiplies like any."""
    groups: dict[tuple[bool, float], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decays = not (p.ndim < 2 or "norm" in name.lower() or name.endswith(".bias"))
        groups.setdefault((decays, (lr_scales or {}).get(id(p), 1.0)), []).append(p)
    out = [
        {"params": groups.get((True, 1.0), []), "weight_decay": weight_decay},
        {"params": groups.get((False, 1.0), []), "weight_decay": 0.0},
    ]
    for (decays, scale), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1])):
        if scale != 1.0:
            out.append({"params": params, "weight_decay": weight_decay if decays else 0.0, "lr": lr * scale})
    return out


def build_engine(cfg: RunConfig, model: torch.nn.Module, plan: TrainPlan, load_universal: bool = False):
    import deepspeed

    if cfg.deepspeed.activation_checkpointing:
        model.gradient_checkpointing_enable()
    _no_padding_probe(model)
    if cfg.optim.name == "lamb" and accelerator_name() == "cpu":
        raise ValueError(
            "optim.name: 'lamb' uses DeepSpeed's FusedLamb, which needs a CUDA accelerator; "
            "use 'adamw' on CPU"
        )
    ds_config = build_ds_config(cfg, plan, load_universal)
    groups = _param_groups(model, cfg.optim.weight_decay, plan.peak_lr, mup.lr_scales(model, cfg.model))
    optimizer = None
    if cfg.optim.name == "adafactor":
        # The T5 paper's optimizer: relative updates (scale_parameter) make T5's std-1 embeddings learn; AdamW's
        # absolute steps of ~lr leave them where they started (docs/results.md). The LR is ours, warmup and decay
        # come from our schedule. Imported here, not at the top: transformers' optimization module costs every
        # rank 0.13 s at start-up and only runs that choose this optimizer need it.
        from pretrain.run.optimizers import paper_adafactor

        optimizer = paper_adafactor(groups, lr=plan.peak_lr)
    elif not _use_ds_optimizer(cfg):
        # fused on CPU too: one kernel per step, and `found_inf` lets StepGuard skip a step without a host read
        optimizer = torch.optim.AdamW(
            groups, lr=plan.peak_lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps, fused=True
        )
    sched = lr_multiplier(cfg, plan)

    def lr_scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(opt, sched)

    engine, _, _, scheduler = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        model_parameters=groups if optimizer is None else None,
        lr_scheduler=lr_scheduler,
        config=ds_config,
    )
    _keep_fp32_clip_norm(engine)
    StepGuard(engine)
    if cfg.deepspeed.compile:
        # regional compilation, one graph shared by the repeated blocks (pretrain/run/models.py)
        n = compile_blocks(engine.module, backend=cfg.deepspeed.compile_backend)
        log.info(
            f"[train] torch.compile ({cfg.deepspeed.compile_backend}) of {n} repeated blocks, one graph each"
        )
    return engine, scheduler, ds_config


def _no_padding_probe(model: torch.nn.Module) -> None:
    """Drop transformers' per-forward padding probe (`pad_token_id in input_ids[:, [-1, 0]]`, a device read on
    every eager micro-batch; skipped under compile). It only warns, and our collators pass an attention mask
    whenever a batch holds padding: full packed blocks go without one on purpose."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.warn_if_padding_and_no_attention_mask = lambda *args, **kwargs: None


def _keep_fp32_clip_norm(engine: Any) -> None:
    """Make `engine.get_global_grad_norm()` report the norm that clipping computed in fp32 at ZeRO stage 0.

    On that path (t5-budget: Adafactor needs ZeRO 0) DeepSpeed clips through `engine.clip_fp32_gradients()`, which
    throws away the norm that `clip_grad_norm_` returns, so `get_global_grad_norm()` stays None and the metrics
    logged 0 for every step. ZeRO 1-3 and the fp16/bf16 optimizers keep it themselves. Replacing the engine's
    method (same call, norm kept) avoids a second pass over the gradients.
    """
    if engine.gradient_clipping() <= 0 or engine.fp16_enabled() or engine.bfloat16_enabled():
        return
    if engine.zero_optimization():
        return
    from deepspeed.runtime.utils import clip_grad_norm_  # as in this whole module: deepspeed where used

    def clip_fp32_gradients() -> None:
        # kept on the device: the metrics read it at logging steps only
        engine._global_grad_norm = clip_grad_norm_(
            parameters=engine.module.parameters(), max_norm=engine.gradient_clipping(), mpu=engine.mpu
        )

    engine.clip_fp32_gradients = clip_fp32_gradients


class StepGuard:
    """Skips an optimizer step on the device when any rank saw a non-finite loss or the gradient norm is not
    finite, so the loop needs no host read to keep a NaN out of the weights.

    torch's fused AdamW takes `found_inf` (the hook GradScaler uses): when it is nonzero the kernel leaves weights
    and moments untouched and rolls its step count back. Other optimizers (Adafactor, DeepSpeed's Lamb and CPU
    Adam) read the flag on the host before stepping: one read per step on those paths. At ZeRO 1/2 the gradient
    norm is computed in one foreach pass instead of tensor by tensor, and clipping no longer reads it on the host
    (DeepSpeed 0.19.8 checks its validity with a `bool()` per parameter group); an invalid norm joins the flag.
    The guard is attached to the engine (`engine.step_guard`)."""

    def __init__(self, engine: Any):
        opt = engine.optimizer
        self.base = getattr(opt, "optimizer", opt)
        self.on_device = bool(getattr(self.base, "defaults", {}).get("fused"))
        self.flag: torch.Tensor | None = None  # this step's decision
        self.armed: torch.Tensor | None = None  # what the loop agreed before the step
        self.skipped: torch.Tensor | None = None
        if not self.on_device:
            step = self.base.step

            def guarded_step(*args: Any, **kwargs: Any) -> Any:
                if self.flag is not None and bool(self.flag):
                    return None
                return step(*args, **kwargs)

            self.base.step = guarded_step
        if _plain_zero12(opt):
            _lean_zero_norm_and_clip(opt, self)
        engine.step_guard = self

    def arm(self, found_inf: torch.Tensor) -> None:
        """The agreed flag for the coming `engine.step()`: a float32 device tensor, nonzero to skip it."""
        self._count()
        self.armed = found_inf
        self._set(found_inf)

    def merge(self, invalid: torch.Tensor) -> None:
        """An invalid gradient norm found inside the step skips it too (idempotent within a step)."""
        self._set(invalid.float() if self.armed is None else torch.maximum(self.armed, invalid.float()))

    def skipped_steps(self) -> torch.Tensor | None:
        """Steps skipped so far, on the device (read at logging steps only); None before the first step."""
        self._count()
        return self.skipped

    def _set(self, flag: torch.Tensor) -> None:
        self.flag = flag
        if self.on_device:
            self.base.found_inf = flag

    def _count(self) -> None:
        if self.flag is not None:
            self.skipped = self.flag if self.skipped is None else self.skipped + self.flag
            self.flag = None


def _plain_zero12(opt: Any) -> bool:
    """ZeRO 1/2 without offload or model parallelism: the layout the foreach norm below is written for."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if not isinstance(opt, DeepSpeedZeroOptimizer) or opt.cpu_offload or opt.has_moe_layers:
        return False
    from deepspeed.comm import pg_utils

    return not pg_utils.is_parallel(opt.model_parallel_group)


def _lean_zero_norm_and_clip(opt: Any, guard: StepGuard) -> None:
    """Replace two DeepSpeed ZeRO 1/2 methods on this optimizer instance by equivalents without host reads."""
    import torch.distributed as dist

    original_norm = opt.get_grad_norm_direct

    def get_grad_norm_direct(gradients: list, params: list, norm_type: float = 2) -> torch.Tensor:
        """DeepSpeed's L2 norm (per-tensor norms in fp32, summed over the data-parallel group, -1 when not
        finite), with the per-tensor norms in one `_foreach_norm` per dtype instead of one kernel chain each."""
        if float(norm_type) != 2.0:
            return original_norm(gradients, params, norm_type)
        grads = [g.detach() for g in gradients if not getattr(g, "_zero_padding", False)]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        total = torch.zeros((), dtype=torch.float32, device=opt.device)
        for group in by_dtype.values():
            norms = torch._foreach_norm(group, 2, dtype=torch.float32)
            total = total + torch.stack(norms).pow(2).sum()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=opt.dp_process_group)
        total = total.pow(0.5)
        # DeepSpeed's mark of an invalid norm, -1, without its masked_fill_ by a tensor value (an .item())
        return torch.where(torch.isfinite(total), total, torch.full_like(total, -1.0))

    def unscale_and_clip_grads(grad_groups_flat: list, total_norm: torch.Tensor) -> None:
        """DeepSpeed's clip with the validity test on the device: an invalid norm (-1 or not finite) skips the
        step through the guard instead of a host read."""
        if total_norm is not None:
            guard.merge(~torch.isfinite(total_norm) | (total_norm < 0))
        if opt.clip_grad == 0.0 and opt.loss_scale == 1.0:
            return
        combined_scale: Any = opt.loss_scale
        if opt.clip_grad > 0.0:
            norm = torch.where(torch.isfinite(total_norm) & (total_norm >= 0), total_norm, float("inf"))
            clip = ((norm / opt.loss_scale) + 1e-6) / opt.clip_grad
            combined_scale = torch.clamp(clip, min=1.0) * opt.loss_scale
        for grad in grad_groups_flat:
            for g in grad if isinstance(grad, list) else [grad]:
                g.data.mul_(1.0 / combined_scale)

    opt.get_grad_norm_direct = get_grad_norm_direct
    opt.unscale_and_clip_grads = unscale_and_clip_grads
