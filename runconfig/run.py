"""The whole run: one YAML, one object, validated across sections before any work starts."""

import os
import re
import tempfile
import warnings
from difflib import get_close_matches
from typing import Any

from pydantic import Field, field_validator, model_validator

from core.io import sha256_bytes
from core.layout import RunPaths, remote_checkpoints
from core.registry import FAMILIES
from runconfig.base import PathComponent, Section
from runconfig.callbacks import check_callbacks
from runconfig.data import DataConfig
from runconfig.export import ExportConfig
from runconfig.finetune import HARNESS_TAG, FinetuneConfig, harness_task_names
from runconfig.init_from import check_run as check_init_from
from runconfig.launch import LaunchConfig
from runconfig.model import ModelConfig
from runconfig.objective import ObjectiveConfig
from runconfig.removed import drop_removed_keys
from runconfig.tokens import LoaderConfig, PackingConfig, ShardsConfig, TokenizerConfig
from runconfig.train import (
    BatchConfig,
    CheckpointConfig,
    DeepSpeedConfig,
    EvalConfig,
    LoggingConfig,
    LRScalingConfig,
    OptimConfig,
    ScheduleConfig,
    SpikesConfig,
    WatchdogConfig,
)


class RunMeta(Section):
    name: PathComponent = "run"
    # A local folder, or an fsspec URL (s3://bucket/prefix, gs://..., memory://...): stages then write into the
    # local staging folder `local_dir` and upload each finished task there, its completion marker last.
    output_dir: str = "runs/run"
    # Local staging folder and cache of a remote output_dir (token shards are memory-mapped and DeepSpeed writes
    # checkpoints to a filesystem). Default: $LMSTACK_CACHE/runs/<url slug>, else <system temp>/lmstack/runs/...
    local_dir: str | None = None
    seed: int = 1234

    @field_validator("output_dir")
    @classmethod
    def _strip_file_scheme(cls, v: str) -> str:
        """file:// is a local path; any other URL stays a URL and is never turned into a local folder (such as
        './memory:/out'): every write to it goes through fsspec."""
        if v.startswith("file://"):
            return v[len("file://") :]
        if "://" in v and not v.split("://", 1)[1].strip("/"):
            raise ValueError(f"'{v}' names no bucket or folder")
        return v

    @field_validator("local_dir")
    @classmethod
    def _local_path(cls, v: str | None) -> str | None:
        if v is not None and "://" in v:
            if not v.startswith("file://"):
                raise ValueError(f"'{v}' is a URL; the staging folder must be a local path")
            v = v[len("file://") :]
        return v

    @property
    def is_remote(self) -> bool:
        return "://" in self.output_dir

    @property
    def root(self) -> str:
        """The local folder every stage reads and writes: output_dir itself, or the staging folder of a URL."""
        if not self.is_remote:
            return self.output_dir
        if self.local_dir:
            return self.local_dir
        base = os.environ.get("LMSTACK_CACHE") or os.path.join(tempfile.gettempdir(), "lmstack")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.output_dir)[:80]
        digest = sha256_bytes(self.output_dir)[:8]
        return os.path.join(base, "runs", f"{slug}-{digest}")


class RunConfig(Section):
    run: RunMeta = RunMeta()
    data: DataConfig
    tokenizer: TokenizerConfig = TokenizerConfig()
    shards: ShardsConfig = ShardsConfig()
    packing: PackingConfig = PackingConfig()
    loader: LoaderConfig = LoaderConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    model: ModelConfig = ModelConfig()
    batch: BatchConfig = BatchConfig()
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    lr_scaling: LRScalingConfig = LRScalingConfig()
    deepspeed: DeepSpeedConfig = DeepSpeedConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    eval: EvalConfig = EvalConfig()
    spikes: SpikesConfig = SpikesConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    launch: LaunchConfig = LaunchConfig()
    export: ExportConfig = ExportConfig()
    watchdog: WatchdogConfig = WatchdogConfig()
    # Outside callbacks switched on for this run: name (an lmstack.callbacks entry point, or module.path:Name) ->
    # its settings, validated by the callback's own typed Settings (docs/extending.md "A training callback"). The
    # built-ins are always on, set by their own sections.
    callbacks: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    inherit: list[str] = Field(default_factory=list, exclude=True)  # consumed by the loader

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        """A removed key at its former default loads (old resolved configs name every key); any other value is
        refused naming what to do instead (runconfig/removed.py)."""
        return drop_removed_keys(data)

    @field_validator("callbacks")
    @classmethod
    def _callbacks(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_callbacks(v)

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        # Which objective and packing a family trains with, and the tokenizer its special tokens assume, come
        # from the registered specs (a built-in's module or an outside package's).
        fam, obj = self.model.spec, self.objective.spec
        pack = self.packing.mode
        if obj.needs_encoder and not fam.has_encoder:
            trainable = [n for n, f in FAMILIES.items() if f.trains(obj)]
            raise ValueError(
                f"objective.type: '{obj.name}' reads every token with a bidirectional encoder, and model.family "
                f"'{fam.name}' has none (families it trains: {trainable})"
            )
        if not fam.trains(obj):
            declared = (
                f"; '{obj.name}' trains the families that declare it: "
                f"{sorted(n for n, f in FAMILIES.items() if f.trains(obj))}"
                if obj.trains is not None
                else ""
            )
            raise ValueError(
                f"objective.type: '{obj.name}' cannot train model.family '{fam.name}' "
                f"(allowed: {sorted(fam.objectives)}{declared})"
            )
        if pack not in obj.packing:
            raise ValueError(
                f"packing.mode: '{pack}' does not fit objective.type '{obj.name}' (allowed: {sorted(obj.packing)})"
            )
        if self.model.init_from is not None:
            check_init_from(self)  # the folder against the run (objective, tokenizer, positions)
        if self.tokenizer.pretrained_path is None and self.tokenizer.type not in fam.tokenizer_types:
            raise ValueError(
                f"tokenizer.type: '{self.tokenizer.type}' has no special tokens for model.family '{fam.name}' "
                f"(allowed: {sorted(fam.tokenizer_types)})"
            )
        limit = self.model.position_limit
        if limit is not None and self.packing.seq_len > limit:
            raise ValueError(
                f"packing.seq_len ({self.packing.seq_len}) exceeds the positions model.max_position_embeddings "
                f"allows ({limit})"
            )
        for key, value in fam.objective_defaults.items():
            if key not in self.objective.model_fields_set:
                setattr(self.objective, key, value)  # the family's default (validated on assignment)
        for key, value in fam.finetune_defaults.items():
            if key not in self.finetune.model_fields_set:
                setattr(self.finetune, key, value)  # the family's fine-tune recipe (validated on assignment)
        for check in (fam.validate, obj.validate):
            if check is not None:
                check(self)
        if self.optim.name == "adafactor" and self.deepspeed.zero_stage != 0:
            # ZeRO 1-3 hand the optimizer flat shards of the parameters: it could neither factor its second moments
            # over a matrix's rows and columns nor scale an update by the matrix's RMS
            raise ValueError(
                f"optim.name: 'adafactor' needs deepspeed.zero_stage: 0 (got {self.deepspeed.zero_stage}): ZeRO "
                "shards would hide the whole matrices it factors and scales by"
            )
        if self.objective.chunked_loss and (
            self.objective.type != "causal" or self.deepspeed.zero_stage == 3
        ):
            raise ValueError(
                f"objective.chunked_loss: needs a causal LM head trained without parameter sharding (objective.type "
                f"'causal', deepspeed.zero_stage 0-2); got model.family '{fam.name}', objective.type "
                f"'{obj.name}', deepspeed.zero_stage {self.deepspeed.zero_stage}"
            )
        if self.deepspeed.offload_params and self.deepspeed.zero_stage != 3:
            raise ValueError("deepspeed.offload_params needs deepspeed.zero_stage: 3")
        if self.deepspeed.offload_optimizer and self.deepspeed.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs deepspeed.zero_stage >= 1")
        # one process's memory: a pool worker's uploads vanish
        if self.run.output_dir.startswith("memory://"):
            for key, n in (
                ("data.clean.workers", self.data.clean.workers),
                ("shards.workers", self.shards.workers),
            ):
                if n > 1:
                    raise ValueError(
                        f"{key}: {n} worker processes cannot write to run.output_dir "
                        f"'{self.run.output_dir}' (memory:// lives in one process); set {key}=1"
                    )
        self._check_tasks()
        window, total = self.logging.profile_steps, self.schedule.total_steps
        if window is not None and self.schedule.budget_minutes is None and window[1] - 1 > (total or 1000):
            raise ValueError(
                f"logging.profile_steps: [{window[0]}, {window[1]}] reaches past the run's last step "
                f"(schedule.total_steps: {total or 1000}): the steps after it would never be traced"
            )
        steps = self.schedule.steps
        if self.spikes.action == "rollback" and steps is not None and self.checkpoint.every_steps >= steps:
            raise ValueError(
                f"spikes.action: 'rollback' needs checkpoints during the run, and checkpoint.every_steps "
                f"({self.checkpoint.every_steps}) >= schedule.total_steps ({steps}) writes none before the end"
            )
        self.batch_plan()  # raises with the key named when the batch does not divide
        self._warn_vocab()
        return self

    def _check_tasks(self) -> None:
        """Each fine-tune task against the run: its source exists, and a regression task has the classification
        head it needs (a text-to-text export scores label strings: refused here, not after pretraining)."""
        names = {s.name for s in self.data.sources}
        fam, obj = self.model.spec, self.objective.spec
        text_to_text = (obj.card_task or fam.task) == "seq2seq"
        for i, task in enumerate(self.finetune.tasks):
            if task.source is not None and task.source not in names:
                raise ValueError(
                    f"finetune.tasks.{i}.source: '{task.source}' is not one of data.sources {sorted(names)}"
                )
            if task.problem == "regression" and text_to_text:
                raise ValueError(
                    f"finetune.tasks.{i}.problem: task '{task.name}' is a regression, which needs a classification "
                    f"head, and model.family '{fam.name}' is text-to-text (its fine-tunes score label strings); "
                    "use problem: classification, or an encoder-only or decoder-only family"
                )

    @model_validator(mode="after")
    def _probe_task(self) -> "RunConfig":
        """eval.probe_task names a defined fine-tune task, runs where rank 0 holds the weights, in bounded time."""
        ev = self.eval
        if ev.probe_task is None:
            return self
        tasks = [t.name for t in self.finetune.tasks]
        if ev.probe_task not in tasks:
            raise ValueError(
                f"eval.probe_task: '{ev.probe_task}' is not a task of finetune.tasks (defined: {tasks or 'none'})"
            )
        index = tasks.index(ev.probe_task)
        if self.finetune.tasks[index].problem == "regression":
            raise ValueError(
                f"eval.probe_task: '{ev.probe_task}' is a regression task (finetune.tasks.{index}.problem: "
                "regression), and the in-training probe scores class labels; name a classification task or unset "
                "eval.probe_task"
            )
        if self.deepspeed.zero_stage == 3:
            raise ValueError(
                "eval.probe_task: the probe runs on rank 0 alone, and at deepspeed.zero_stage 3 no rank holds the "
                "whole weights; use zero_stage 0-2 or unset eval.probe_task"
            )
        if ev.probe_max_seconds >= self.deepspeed.comm_timeout_s:
            raise ValueError(
                f"eval.probe_max_seconds ({ev.probe_max_seconds:g}) must be below deepspeed.comm_timeout_s "
                f"({self.deepspeed.comm_timeout_s}): the other ranks wait for the probe in a collective"
            )
        return self

    @model_validator(mode="after")
    def _eval_tasks(self) -> "RunConfig":
        """eval.tasks names local harness tasks of finetune.tasks, on a causal LM whose whole weights every rank
        holds (each scores its share of the documents)."""
        names = self.eval.tasks
        if not names:
            return self
        fam, obj = self.model.spec, self.objective.spec
        if (obj.card_task or fam.task) != "causal_lm":
            raise ValueError(
                f"eval.tasks: model.family '{fam.name}' with objective '{obj.name}' is not a causal LM, and "
                "lm-evaluation-harness scores next-token log-likelihoods; an encoder's in-loop signal is "
                "eval.probe_task (a frozen-body probe), its downstream one `python -m adapt transfer`"
            )
        local: dict[str, str] = {}
        for task in self.finetune.tasks:
            local |= harness_task_names(task)
        for name in names:
            if name not in local and not (name == HARNESS_TAG and local):
                close = get_close_matches(name, [HARNESS_TAG, *local], n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise ValueError(
                    f"eval.tasks: '{name}' is not a local task{hint} (those of finetune.tasks: "
                    f"{sorted(local) or 'none, as no fine-tune task is defined'}, or '{HARNESS_TAG}' for all; the "
                    "harness's own tasks need their datasets from the network: run them on the export with "
                    "`python -m adapt evaluate`)"
                )
        if self.deepspeed.zero_stage == 3:
            raise ValueError(
                "eval.tasks: every rank scores its share of the documents with the whole weights, and at "
                "deepspeed.zero_stage 3 no rank holds them; use zero_stage 0-2, or score the export with "
                "`python -m adapt evaluate`"
            )
        return self

    @model_validator(mode="after")
    def _float8_training(self) -> "RunConfig":
        if self.model.float8 == "none":
            return self
        # fp16's loss scaling multiplies the gradients torchao casts to e5m2 (overflow), and ZeRO-3 gathers
        # each weight inside the forward where torchao casts it: neither is what torchao's recipes test
        if self.deepspeed.precision == "fp16":
            raise ValueError(
                f"model.float8: {self.model.float8} trains with deepspeed.precision bf16 (or fp32), not fp16"
            )
        if self.deepspeed.zero_stage == 3:
            raise ValueError(
                f"model.float8: {self.model.float8} needs deepspeed.zero_stage 0-2 (got 3: ZeRO-3 gathers "
                "each weight inside the forward that casts it to float8)"
            )
        return self

    @model_validator(mode="after")
    def _hang_before_comm_timeout(self) -> "RunConfig":
        hang, comm = self.watchdog.hang_timeout_s, self.deepspeed.comm_timeout_s
        if hang is not None and hang >= comm:
            raise ValueError(
                f"watchdog.hang_timeout_s: {hang} must be below deepspeed.comm_timeout_s ({comm}): the stuck rank "
                "must still be alive to dump its stacks when the others' collectives time out"
            )
        return self

    def _warn_vocab(self) -> None:
        """A vocabulary far beyond any real tokenizer (a typo such as an extra 0) makes the embedding dominate
        the ZeRO memory plan: model states (fp32 weights, grads, Adam moments: 16 bytes/param) of the
        embedding alone, before ZeRO partitions them."""
        v, h = self.tokenizer.vocab_size, self.model.hidden_size
        gib = v * h * 16 / 2**30
        if v > 1_000_000 or gib > 64:
            warnings.warn(
                f"tokenizer.vocab_size ({v:,}) is absurd for the ZeRO memory plan: the embedding alone needs "
                f"{gib:.1f} GiB of model states (x{h} hidden); see `python -m pretrain plan`",
                UserWarning,
                stacklevel=2,
            )

    def batch_plan(self, world_size: int | None = None) -> dict[str, int]:
        """Global batch -> (micro-batch, accumulation) for a world size; the one place this is derived."""
        ws = world_size or self.launch.world_size
        gbs = self.batch.global_batch_size
        if self.batch.global_batch_tokens is not None:
            if self.batch.global_batch_tokens % self.packing.seq_len:
                raise ValueError(
                    f"batch.global_batch_tokens ({self.batch.global_batch_tokens}) is not a multiple of "
                    f"packing.seq_len ({self.packing.seq_len})"
                )
            gbs = self.batch.global_batch_tokens // self.packing.seq_len
        per_step = self.batch.micro_batch_size * ws
        if gbs % per_step:
            raise ValueError(
                f"batch.global_batch_size ({gbs}) is not divisible by batch.micro_batch_size "
                f"({self.batch.micro_batch_size}) x world size ({ws}) = {per_step}"
            )
        return {
            "global_batch_size": gbs,
            "micro_batch_size": self.batch.micro_batch_size,
            "world_size": ws,
            "grad_accum": gbs // per_step,
        }

    @property
    def checkpoint_remote(self) -> str | None:
        """Where checkpoints are uploaded: <run.output_dir>/checkpoints of a remote run (None: local only)."""
        return (
            remote_checkpoints(self.run.output_dir)
            if self.run.is_remote and not self.checkpoint.dir
            else None
        )

    @property
    def checkpoint_dir(self) -> str:
        return str(RunPaths.from_config(self).checkpoints)
