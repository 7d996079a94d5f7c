"""Model families as specs (torchtitan's `ModelSpec`): everything the pipeline needs to know about a family in one
object, found by name. Adding a family is one file that calls `register_family` (listed in `BUILTIN` here, or
exposed by an outside package through the `lmstack.families` entry point group).

A spec module must import without torch/transformers (config validation reads it): name HF classes as strings
('RobertaForMaskedLM' from transformers, or 'package.module:Class') and import inside the config builder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from runconfig.finetune import FinetuneConfig
from runconfig.registry import Registry, resolve

if TYPE_CHECKING:
    from runconfig.model import ModelConfig
    from runconfig.run import RunConfig

BUILTIN = (
    "pretrain.families.roberta",
    "pretrain.families.gpt2",
    "pretrain.families.t5",
    "pretrain.families.modernbert",
    "pretrain.families.electra",
)


def default_probe_inputs(tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """The fixed parity batch: the texts, padded, truncated to 32 tokens."""
    enc = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def attention_layers(m: ModelConfig) -> int:
    return m.num_layers


def default_flops_per_token(spec: FamilySpec, m: ModelConfig, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weight matmuls (forward + backward) plus the attention score and
    value matmuls, 12 * layers * attention width * seq_len (PaLM appendix B)."""
    attn_width = (m.d_kv or m.hidden_size // m.num_heads) * m.num_heads
    return 6.0 * n_params + 12.0 * spec.attention_layers(m) * attn_width * seq_len


@dataclass(frozen=True)
class FamilySpec:
    name: str
    # (model section, tokenizer, seq_len, padded vocab size) -> a transformers PretrainedConfig.
    build_config: Callable[[ModelConfig, Any, int, int], Any]
    model_class: str | type  # the pretraining model, built from scratch from build_config's output
    task: Literal["masked_lm", "causal_lm", "seq2seq", "token_detection"]
    objectives: tuple[str, ...]  # objective.type values it trains with
    tokenizer_types: tuple[str, ...]  # tokenizer.type values whose special tokens it assumes
    auto_class: str = "AutoModel"  # what loads the export with its pretraining head (parity, reload check)
    # Further Auto classes the exported folder must load with (fine-tuning heads); the export loads each one
    # and records the class it got in training_state.json.
    export_heads: tuple[str, ...] = ("AutoModelForSequenceClassification",)
    # Positions of the table a sequence cannot use (RoBERTa's padding_idx + 1 offset: 2); None: no position
    # table bounds the sequence (T5's relative buckets).
    reserved_positions: int | None = 0
    wraps_sequences: bool = True  # byte-level BPE post-processing adds `<s> A </s>` (RoBERTa) or nothing (GPT-2)
    has_encoder: bool = True  # a bidirectional encoder (what replaced-token detection or classification reads)
    encoder_decoder: bool = False
    generative: bool = False  # the export carries a GenerationConfig (padding rows of the vocab suppressed)
    probe_inputs: Callable[[Any, list[str]], dict[str, Any]] = default_probe_inputs
    attention_layers: Callable[[ModelConfig], int] = attention_layers  # layers whose attention FLOPs count
    flops_per_token: Callable[[FamilySpec, ModelConfig, int, int], float] = default_flops_per_token
    validate: Callable[[RunConfig], None] | None = None  # family-specific config checks (raise naming the key)
    # A typed section (pydantic, unknown keys rejected) for the family's own `model.options` keys.
    options: type | None = None
    # Objective settings this family defaults to when the config does not set them (ModernBERT: 30% masking).
    objective_defaults: dict[str, Any] = field(default_factory=dict)
    # The attribute holding the MLM prediction head (transform + vocabulary projection) on top of `base_model`,
    # for the MLM objective's sparse prediction; None: the family has none, or predicts sparsely itself.
    mlm_head: str | None = None
    # HF config fields the exported folder gets instead of the training ones (e.g. sparse prediction off, so
    # the export returns dense logits as the published checkpoints do).
    export_config: dict[str, Any] = field(default_factory=dict)
    # `finetune` settings this family fine-tunes with when the config does not set them (its paper's and the HF
    # examples' recipe: lr_grid, warmup_ratio, weight_decay); checked with the finetune section's own rules when
    # the spec is made, so a bad default (an LR <= 0, inf, nan) is refused naming the family and the key.
    finetune_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.finetune_defaults:
            unknown = sorted(set(self.finetune_defaults) - set(FinetuneConfig.model_fields))
            if unknown:
                raise ValueError(f"model.family '{self.name}': finetune_defaults has unknown finetune keys {unknown}")
            try:
                FinetuneConfig.model_validate(self.finetune_defaults)
            except ValueError as e:
                first = e.errors()[0] if hasattr(e, "errors") else {"loc": (), "msg": str(e)}
                key = ".".join(str(x) for x in first["loc"]) or ", ".join(self.finetune_defaults)
                raise ValueError(f"model.family '{self.name}': finetune_defaults.{key}: {first['msg']}") from None

    def model_cls(self) -> type:
        return resolve(self.model_class)  # type: ignore[return-value]

    def auto_cls(self, name: str | None = None) -> type:
        return resolve(name or self.auto_class)  # type: ignore[return-value]

    def position_limit(self, max_position_embeddings: int) -> int | None:
        """The longest sequence the position table allows (None: unbounded by the table)."""
        return None if self.reserved_positions is None else max_position_embeddings - self.reserved_positions


FAMILIES: Registry[FamilySpec] = Registry("model.family", "lmstack.families", FamilySpec, BUILTIN)


def register_family(spec: FamilySpec, *, replace: bool = False) -> FamilySpec:
    return FAMILIES.register(spec, replace=replace)


def get_family(name: str) -> FamilySpec:
    return FAMILIES.get(name)


def family_names() -> list[str]:
    return FAMILIES.names()
