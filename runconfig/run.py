"""The whole run: one YAML, one object, validated across sections before any work starts."""

from pydantic import Field, field_validator, model_validator

from runconfig.base import Section
from runconfig.data import DataConfig
from runconfig.export import ExportConfig
from runconfig.launch import LaunchConfig
from runconfig.model import ModelConfig
from runconfig.objective import ObjectiveConfig
from runconfig.tokens import LoaderConfig, PackingConfig, ShardsConfig, TokenizerConfig
from runconfig.train import (
    BatchConfig,
    CheckpointConfig,
    DeepSpeedConfig,
    EvalConfig,
    FinetuneConfig,
    LoggingConfig,
    LRScalingConfig,
    OptimConfig,
    ScheduleConfig,
)

# Which objective and packing each family can train with, and the tokenizer its special tokens assume.
FAMILY_OBJECTIVES = {"roberta": {"mlm"}, "gpt2": {"causal"}, "t5": {"span_corruption"}}
OBJECTIVE_PACKING = {
    "mlm": {"full_sentences", "line_by_line"},
    "causal": {"contiguous", "line_by_line"},
    "span_corruption": {"t5_spans"},
}


class RunMeta(Section):
    name: str = "run"
    output_dir: str = "runs/run"
    seed: int = 1234

    @field_validator("output_dir")
    @classmethod
    def _local_folder(cls, v: str) -> str:
        """The run folder holds memory-mapped token shards and DeepSpeed checkpoints: it must be a filesystem
        path (a mounted bucket works). A URL is never turned into a local folder such as './memory:/out'."""
        if "://" in v:
            scheme = v.split("://", 1)[0]
            if scheme != "file":
                raise ValueError(f"'{v}' is a {scheme}:// URL; the run folder must be a local or mounted path "
                                 "(data sources may be URLs: data.sources.N.paths)")
            v = v.split("://", 1)[1]
        return v


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
    finetune: FinetuneConfig = FinetuneConfig()
    launch: LaunchConfig = LaunchConfig()
    export: ExportConfig = ExportConfig()
    inherit: list[str] = Field(default_factory=list, exclude=True)  # consumed by the loader

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        fam, obj, pack = self.model.family, self.objective.type, self.packing.mode
        if obj not in FAMILY_OBJECTIVES[fam]:
            raise ValueError(
                f"objective.type: '{obj}' cannot train model.family '{fam}' "
                f"(allowed: {sorted(FAMILY_OBJECTIVES[fam])})"
            )
        if pack not in OBJECTIVE_PACKING[obj]:
            raise ValueError(
                f"packing.mode: '{pack}' does not fit objective.type '{obj}' "
                f"(allowed: {sorted(OBJECTIVE_PACKING[obj])})"
            )
        expected_tok = {"roberta": {"bpe", "wordpiece"}, "gpt2": {"bpe"}, "t5": {"unigram"}}[fam]
        if self.tokenizer.pretrained_path is None and self.tokenizer.type not in expected_tok:
            raise ValueError(
                f"tokenizer.type: '{self.tokenizer.type}' has no special tokens for model.family '{fam}' "
                f"(allowed: {sorted(expected_tok)})"
            )
        if fam != "t5":
            limit = self.model.max_position_embeddings - (2 if fam == "roberta" else 0)
            if self.packing.seq_len > limit:
                raise ValueError(
                    f"packing.seq_len ({self.packing.seq_len}) exceeds the positions model.max_position_embeddings "
                    f"allows ({limit})"
                )
        if self.deepspeed.offload_params and self.deepspeed.zero_stage != 3:
            raise ValueError("deepspeed.offload_params needs deepspeed.zero_stage: 3")
        if self.deepspeed.offload_optimizer and self.deepspeed.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs deepspeed.zero_stage >= 1")
        if self.finetune.source is not None:
            names = {s.name for s in self.data.sources}
            if self.finetune.source not in names:
                raise ValueError(f"finetune.source: '{self.finetune.source}' is not one of data.sources {sorted(names)}")
        self.batch_plan()  # raises with the key named when the batch does not divide
        return self

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
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or f"{self.run.output_dir}/checkpoints"
