"""Batch plan, optimizer, schedule, LR scaling, DeepSpeed engine, checkpointing, logging, evaluation."""

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runconfig.base import Section


class BatchConfig(Section):
    # The user states the global batch; gradient accumulation is derived from micro-batch x world size.
    global_batch_size: int = Field(32, gt=0)  # sequences per optimizer step
    micro_batch_size: int = Field(8, gt=0)  # sequences per rank per forward
    # Alternative to global_batch_size: tokens per optimizer step (must be a multiple of seq_len).
    global_batch_tokens: int | None = None


class OptimConfig(Section):
    # adafactor: transformers' Adafactor as the T5 paper trains with it (updates scaled by each matrix's RMS, factored
    # second moments, no momentum); betas and eps are Adam's and do not apply to it. Needs deepspeed.zero_stage 0.
    name: Literal["adamw", "lamb", "adafactor"] = "adamw"
    lr: float = Field(6e-4, gt=0)  # peak LR at the global batch (after lr_scaling, if any)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, ge=0)

    @model_validator(mode="after")
    def _betas_in_range(self) -> "OptimConfig":
        for i, b in enumerate(self.betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"optim.betas.{i}: {b} is outside [0, 1) (Adam's moment decay rates)")
        return self


class ScheduleConfig(Section):
    """Warmup then decay, counted in optimizer steps or, with `budget_minutes`, in elapsed training time
    (Cramming, Geiping & Goldstein 2023): the run ends when the budget is spent, with the LR at its floor."""

    total_steps: int | None = Field(None, gt=0)  # None: 1000 steps, or the time budget when one is set
    warmup_steps: int | None = Field(None, ge=0)  # None: warmup_fraction if set, else min(100, total_steps)
    warmup_fraction: float | None = Field(None, ge=0, lt=1)  # of total_steps, or of the time budget
    # wall-clock training budget; warmup/decay follow the clock
    budget_minutes: float | None = Field(None, gt=0)
    # wsd: warmup, a constant stable phase, then a cool-down over the last decay_fraction of the run (MiniCPM;
    # Hägele et al. 2024): a decay branch can start that cool-down from any stable-phase checkpoint
    decay: Literal["linear", "cosine", "constant", "wsd"] = "linear"
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    decay_fraction: float | None = Field(
        None, gt=0, lt=1
    )  # wsd: the cool-down's share of the run (default 0.2)
    # wsd: the cool-down's shape (default 1-sqrt, the best of the three in Hägele et al. 2024)
    decay_shape: Literal["linear", "cosine", "1-sqrt"] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ScheduleConfig":
        self._check_wsd()
        if self.budget_minutes is not None:
            if self.total_steps is not None:
                raise ValueError(
                    f"schedule.total_steps ({self.total_steps}) conflicts with schedule.budget_minutes "
                    f"({self.budget_minutes}): a time-budget run ends when its time is spent; set "
                    "schedule.total_steps: null"
                )
            if self.warmup_steps is not None:
                raise ValueError(
                    f"schedule.warmup_steps ({self.warmup_steps}) conflicts with schedule.budget_minutes: warmup "
                    "follows the clock, set schedule.warmup_fraction instead (and schedule.warmup_steps: null)"
                )
        elif self.warmup_steps is not None and self.warmup_fraction is not None:
            raise ValueError(
                "schedule.warmup_steps and schedule.warmup_fraction are both set: set one of them"
            )
        elif self.warmup_steps is not None and self.steps is not None and self.warmup_steps > self.steps:
            raise ValueError(
                f"schedule.warmup_steps ({self.warmup_steps}) exceeds schedule.total_steps ({self.steps})"
            )
        return self

    def _check_wsd(self) -> None:
        for key in ("decay_fraction", "decay_shape"):
            if self.decay != "wsd" and getattr(self, key) is not None:
                raise ValueError(f"schedule.{key} applies to schedule.decay: wsd (the decay is {self.decay})")
        if self.decay == "wsd" and self.steps is not None and self.warmup > self.wsd_decay_start:
            raise ValueError(
                f"schedule.warmup ({self.warmup} steps) runs past the cool-down's start (step "
                f"{self.wsd_decay_start}, schedule.decay_fraction {self.wsd_fraction}): shorten one of them"
            )

    @property
    def wsd_fraction(self) -> float:
        return 0.2 if self.decay_fraction is None else self.decay_fraction

    @property
    def wsd_shape(self) -> str:
        return self.decay_shape or "1-sqrt"

    @property
    def wsd_decay_start(self) -> int:
        """The first step of a step-counted WSD run's cool-down (its last `decay_fraction` of steps)."""
        steps = self.steps or 0
        return steps - round(self.wsd_fraction * steps)

    @property
    def budget_s(self) -> float | None:
        return None if self.budget_minutes is None else self.budget_minutes * 60.0

    @property
    def steps(self) -> int | None:
        """Optimizer steps of a step-counted run; None for a time-budget run."""
        return None if self.budget_minutes is not None else (self.total_steps or 1000)

    @property
    def warmup(self) -> int:
        """Warmup steps of a step-counted run (0 for a time-budget run: see warmup_fraction)."""
        if self.steps is None:
            return 0
        if self.warmup_steps is not None:
            return self.warmup_steps
        if self.warmup_fraction is not None:
            return round(self.warmup_fraction * self.steps)
        return min(100, self.steps)


class LRScalingConfig(Section):
    """Scale a reference recipe (batch, peak LR, warmup) to the configured global batch."""

    rule: Literal["none", "linear", "sqrt"] = "none"
    # The global batch the reference LR and warmup were tuned for (required with a rule).
    reference_batch_size: int | None = Field(None, gt=0)
    reference_lr: float | None = Field(None, gt=0)  # default: optim.lr
    reference_warmup_steps: int | None = Field(None, ge=0)  # default: schedule.warmup_steps
    max_lr: float | None = None  # cap for the scaled LR

    @model_validator(mode="after")
    def _reference_batch(self) -> "LRScalingConfig":
        if self.rule != "none" and self.reference_batch_size is None:
            raise ValueError(
                f"lr_scaling.reference_batch_size: required with lr_scaling.rule={self.rule}: the global batch the "
                "reference LR and warmup (default: optim.lr, schedule.warmup_steps) were tuned for"
            )
        return self


class DeepSpeedConfig(Section):
    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False
    offload_params: bool = False
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    initial_loss_scale_power: int = 16
    activation_checkpointing: bool = False
    # Collective timeout owned by us: ZeRO's groups otherwise inherit torch's 30-minute default, so a hung
    # node would hang the job (seen on simulated hosts).
    comm_timeout_s: int = Field(600, gt=0)
    # Halt after this many consecutive non-finite losses (fp16 overflow skips are counted by DeepSpeed).
    max_consecutive_bad_steps: int = Field(20, gt=0)
    # torch.compile of each repeated block (pretrain.run.models.compile_blocks; state-dict names unchanged); GPU presets
    # turn it on.
    compile: bool = False
    compile_backend: str = "inductor"  # torch.compile backend ("aot_eager" needs no C++ toolchain)


class CheckpointConfig(Section):
    dir: str | None = None  # default: <run.output_dir>/checkpoints
    every_steps: int = Field(100, gt=0)
    keep_last: int = Field(3, gt=0)
    resume: str = "auto"  # auto | none | <checkpoint folder>
    # Resume even where the config differs from the checkpoint's in keys that are not safe to change.
    accept_config_changes: bool = False
    # Resume with a new data order (`--reset-data-order`): when run.seed, the tokenizer, the data sources or the
    # packing differ from the checkpoint's, the weights, optimizer and step are restored and the loader starts
    # the new order from its beginning. Without it such a change is refused. A rerun (requeue) with the flag
    # whose data order already matches resumes it normally: nothing is reset twice.
    reset_data_order: bool = False
    # async: saving returns once every rank's state is copied to host memory (DeepSpeed's model and optimizer state,
    # the RNG state); the parity probe's logits (computed from that copy of the weights on the host, under ZeRO
    # 0-2), writing those files, hashing, COMPLETE, `latest`, pruning and a remote run's upload finish in a
    # background thread (the next save and the end of the run wait for it), so a save needs host memory for one
    # copy of the rank's checkpoint, kept from the first save on and refilled by each (page-locked from a GPU).
    # disabled: all of it before the step goes on. The background part needs a core the step leaves idle, as a GPU
    # node's host has: where every core trains (CPU ranks, one per core), its CPU time comes out of the next steps,
    # and on 2 busy CPU ranks they lost more in all than disabled took (docs/results.md).
    async_mode: Literal["disabled", "async"] = "async"


class WandbConfig(Section):
    """Weights & Biases (optional extra `lmstack[wandb]`); mode offline writes runs to sync later."""

    enabled: bool = False
    project: str = "lmstack"
    entity: str | None = None
    name: str | None = None  # default: run.name
    mode: Literal["online", "offline"] = "online"
    dir: str | None = None  # default: <run.output_dir>/logs
    # wandb.init's `reinit` (the string setting; the boolean is deprecated): what an init does while a run is
    # active. finish_previous = the old reinit=True.
    reinit: Literal["default", "return_previous", "finish_previous", "create_new"] = "finish_previous"


class MlflowConfig(Section):
    """MLflow (optional extra `lmstack[mlflow]`); the default tracking URI is a local folder in the run."""

    enabled: bool = False
    tracking_uri: str | None = None  # default: file:<run.output_dir>/logs/mlruns
    experiment: str = "lmstack"
    run_name: str | None = None  # default: run.name


class LoggingConfig(Section):
    every_steps: int = Field(10, gt=0)
    tensorboard: bool = True
    jsonl: bool = True
    wandb: WandbConfig = WandbConfig()
    mlflow: MlflowConfig = MlflowConfig()
    # PNG curves in <run>/logs/plots at the end of training (also: python -m pretrain plot)
    plots: bool = True
    progress_bar: bool = True
    # Published peak FLOP/s per device (e.g. 989e12: H100 SXM dense bf16): the console, TensorBoard, mfu.png and
    # the card show MFU against it. None: no MFU anywhere; the rows log `probe_util`, model FLOP/s over a matmul
    # probe of this host, labelled as such (on a CPU it reads 30-60% and is no MFU).
    peak_flops: float | None = None
    # [start, end]: optimizer steps start..end-1 traced with torch.profiler into <run>/logs/profile (a trace per
    # rank and a summary: top ops/kernels, device idle fraction, host reads per step); None = off
    profile_steps: tuple[int, int] | None = None

    @field_validator("profile_steps")
    @classmethod
    def _profile_window(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None and not 1 <= v[0] < v[1]:
            raise ValueError(
                f"logging.profile_steps: [{v[0]}, {v[1]}] is not a window of steps: it needs 1 <= start < end "
                "(steps start..end-1 are traced)"
            )
        return v


class EvalConfig(Section):
    """Held-out loss (mixed and per data source) and, optionally, a frozen-body linear probe on a fine-tune task
    and lm-evaluation-harness tasks on its held-out text: the transfer and zero-shot signals that held-out loss
    alone does not give (pretrain/run/evaluation.py, pretrain/callbacks/probe.py, pretrain/callbacks/tasks.py)."""

    every_steps: int = Field(100, gt=0)
    # Micro-batches per rank for EACH data source (its held-out samples spread over the ranks, a short last batch
    # counting for what it holds): loss/<source>; the mixed loss is the sample-weighted mean over all of them.
    max_batches: int = Field(10, gt=0)
    # A finetune.tasks name: at every eval, rank 0 fits a logistic-regression probe on the body's mean-pooled last
    # hidden states of that task's train examples and scores its dev examples (never its test split); once, at the
    # run's start, the same for the random-init weights (kept in the checkpoints). The other ranks wait.
    # Needs deepspeed.zero_stage 0-2 (rank 0 holds the whole weights). None: no probe.
    # (at most 512 examples per split, a fixed subset chosen by id hash: pretrain/run/probe_eval.py PROBE_MAX_EXAMPLES)
    probe_task: str | None = None
    # Time bound of one probe: encoding stops when it is spent and the examples encoded so far are used (counted in
    # probe/train_examples); must stay below deepspeed.comm_timeout_s, which the waiting ranks run under.
    probe_max_seconds: float = Field(120.0, gt=0)
    # lm-evaluation-harness tasks scored at every eval (each rank a share of the documents, rank 0 logs), with the
    # harness's own HFLM on the weights being trained (pretrain/run/harness.py): names of the local tasks `python -m data_pipeline eval-tasks` writes from
    # finetune.tasks' held-out splits into <run>/eval_tasks (written at the run's start when absent), or `lmstack`
    # for all of them. Logged as tasks/<task>/<metric>; once, at the run's start, the same for the random-init
    # weights (kept in the checkpoints). Causal families only, at deepspeed.zero_stage 0-2. []: none.
    tasks: list[str] = []
    # Documents per task (the harness's --limit; `python -m adapt evaluate --limit` with the same number gives the
    # same figure on the export); None: every document of each task's test split. At 100 the three BBC tasks
    # cost the demo about 5% of its training time at eval.every_steps 200 (bench/evaluation.py); a figure over
    # 100 documents moves by about 5 points of accuracy between draws.
    tasks_limit: int | None = Field(100, gt=0)


class SpikesConfig(Section):
    """Loss spikes: each step's loss, agreed by all ranks, against the mean and standard deviation of the last
    `window` non-spiking step losses (OLMo-core's skip-step rule: 6 sigma over 128 steps, judged once half the
    window is filled). Every rank takes the same decision on the device, with no extra collective or host read."""

    # none | skip: the step's update is not applied and the loader moves on | rollback: reload the last complete
    # checkpoint and skip the data since it (recorded in the checkpoints) | stop: exit LOSS_SPIKE (79), named
    action: Literal["none", "skip", "rollback", "stop"] = "none"
    window: int = (
        128  # step losses the mean and deviation are taken over (>= 8); judged once half of it is filled
    )
    sigma: float = 6.0  # a spike: loss > mean + sigma x standard deviation of the window
    # this many spikes in a row stop a `skip` run (exit LOSS_SPIKE): the loss has moved, skipping would never end
    max_consecutive: int = 10
    # rollbacks to one checkpoint before a `rollback` run stops (exit LOSS_SPIKE): a spike or non-finite loss that
    # comes back after each reload is the recipe's (learning rate, data), not one bad batch's
    max_rollbacks: int = 3

    @field_validator("sigma")
    @classmethod
    def _positive_sigma(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"spikes.sigma: {v} must be > 0 (a spike is loss > mean + sigma x deviation)")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v: int) -> int:
        if v < 8:
            raise ValueError(
                f"spikes.window: {v} is too small (>= 8): the deviation of fewer than 4 losses flags noise as spikes"
            )
        return v

    @field_validator("max_consecutive", "max_rollbacks")
    @classmethod
    def _positive_count(cls, v: int, info: ValidationInfo) -> int:
        if v <= 0:
            raise ValueError(f"spikes.{info.field_name}: {v} must be > 0")
        return v


class WatchdogConfig(Section):
    """Hangs and slow ranks named while the run is alive (pretrain/run/watchdog.py): a per-rank heartbeat in the job's
    store, stack dumps into <run>/logs/hang when a rank stops making progress, and per-rank step figures gathered at
    each logging step."""

    # The heartbeat thread and the hang procedure (false: a hang ends at the collective timeout, unnamed); the
    # straggler figures are gathered either way.
    enabled: bool = True
    # Seconds without progress (a new micro-batch, a finished step) after which every rank dumps its stacks into
    # <run>/logs/hang, the ranks and hosts that did not arrive are named, and the run exits HUNG (69). Below
    # deepspeed.comm_timeout_s, so that the stuck rank is still alive to dump. None: 90% of comm_timeout_s.
    # Evaluation, checkpoints and the first step wait up to comm_timeout_s. Time the job was suspended (SIGSTOP,
    # scontrol suspend, Ctrl-Z, a paused VM) does not count. A hung run ends within this plus 3 heartbeat_s + 5 s.
    hang_timeout_s: float | None = Field(None, gt=0)
    # How often each rank writes its heartbeat (step, phase, host) to the store and looks for a hang report.
    heartbeat_s: float = Field(5.0, gt=0)
    # A rank whose own time per step (forward passes plus loader wait, waits for other ranks left out) exceeds the
    # median rank's by this factor is logged with its host and counted (`stragglers` in the metrics). > 1.
    # (and slower than it by at least 0.05 s per step, a fixed floor: steps of milliseconds jitter by more)
    straggler_factor: float = 1.5

    @field_validator("straggler_factor")
    @classmethod
    def _factor_above_one(cls, v: float) -> float:
        if not v > 1.0:
            raise ValueError(
                f"watchdog.straggler_factor: {v} must be > 1 (a rank is a straggler when its step time exceeds "
                "the median rank's by this factor)"
            )
        return v
