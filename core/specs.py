"""The spec types: what the config validates names and combinations against (torchtitan's `protocols/` style:
plain dataclasses), and nothing per plug-in.

A `FamilySpec` says, per model family, which objectives it trains, which tokenizer conventions its special
tokens assume, how many positions its table reserves, whether it has an encoder or a decoder, its typed
`model.options`, its config checks and the functions that build it. An `ObjectiveSpec` says which packing modes
fit an objective, its framing, its typed `objective.options`, checks and hooks. Every spec, built-in or outside,
is one module that gives the whole spec (data and implementation, heavy imports inside the functions) and one
entry point naming it: the built-ins' are in pyproject.toml (core/registry.py reads them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Options(BaseModel):
    """Base of a spec's typed options section: unknown keys are errors (as every config section)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False
    )


class FinetuneRecipe(Options):
    """A family's fine-tune recipe: the `finetune` keys it sets where the config does not (its paper's and the HF
    examples' LR grid, warmup, weight decay and optimizer). Checked with the finetune section's own rules."""

    lr_grid: list[float] | None = None
    warmup_ratio: float | None = Field(None, ge=0, lt=1)
    weight_decay: float | None = Field(None, ge=0)
    optim: Literal["adamw", "adafactor"] | None = None

    @model_validator(mode="after")
    def _valid_grid(self) -> FinetuneRecipe:
        if self.lr_grid is not None:
            if not self.lr_grid:
                raise ValueError("finetune.lr_grid is empty: give at least one learning rate")
            if any(lr <= 0 for lr in self.lr_grid):
                raise ValueError(f"finetune.lr_grid: learning rates must be > 0, got {self.lr_grid}")
        return self


def check_finetune_recipe(family: str, recipe: dict[str, Any]) -> None:
    """A bad recipe is refused when the spec is made, naming the family and the key."""
    unknown = sorted(set(recipe) - set(FinetuneRecipe.model_fields))
    if unknown:
        raise ValueError(f"model.family '{family}': finetune_defaults has unknown finetune keys {unknown}")
    try:
        FinetuneRecipe.model_validate(recipe)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(x) for x in first["loc"]) or ", ".join(recipe)
        raise ValueError(f"model.family '{family}': finetune_defaults.{key}: {first['msg']}") from None


def resolve(ref: object) -> Any:
    """A class given directly or by reference: 'module:Name', or a bare name in `transformers`."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.rpartition(":")
    return getattr(importlib.import_module(module or "transformers"), attr)


# ------------------------------------------------------------------------------------------------------ families


def default_probe_inputs(tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """The fixed parity batch: the texts, padded, truncated to 32 tokens."""
    enc = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def attention_layers(m: Any) -> int:
    return int(m.num_layers)


def default_flops_per_token(spec: FamilySpec, m: Any, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weight matmuls (forward + backward) plus the attention score and
    value matmuls, 12 * layers * attention width * seq_len (PaLM appendix B)."""
    attn_width = (m.d_kv or m.hidden_size // m.num_heads) * m.num_heads
    return 6.0 * n_params + 12.0 * spec.attention_layers(m) * attn_width * seq_len


def training_flops_per_token(
    spec: FamilySpec, m: Any, n_params: int, seq_len: int, rerun: tuple[int, float] = (0, 0.0)
) -> float:
    """The family's FLOPs per token for `n_params` matmul weights, plus `rerun` (`ObjectiveSpec.rerun`: weights run
    forward and backward once more on a fraction of each sequence), counted the same way: an upper bound for the
    rerun's attention, which a shorter view shrinks. The trainer's MFU and `plan` both count this way."""
    fpt = spec.flops_per_token(spec, m, n_params, seq_len)
    weights, fraction = rerun
    if fraction > 0:
        fpt += fraction * spec.flops_per_token(spec, m, weights, seq_len)
    return fpt


@dataclass(frozen=True)
class FamilySpec:
    # --- data: what config validation reads
    name: str
    task: Literal["masked_lm", "causal_lm", "seq2seq", "token_detection"]
    objectives: tuple[str, ...]  # objective.type values it trains with
    tokenizer_types: tuple[str, ...]  # tokenizer.type values whose special tokens it assumes
    # Positions of the table a sequence cannot use (RoBERTa's padding_idx + 1 offset: 2); None: no position
    # table bounds the sequence (T5's relative buckets).
    reserved_positions: int | None = 0
    # byte-level BPE post-processing adds `<s> A </s>` (RoBERTa) or nothing (GPT-2)
    wraps_sequences: bool = True
    # a bidirectional encoder (what replaced-token detection or classification reads)
    has_encoder: bool = True
    encoder_decoder: bool = False
    generative: bool = False  # the export carries a GenerationConfig (padding rows of the vocab suppressed)
    validate: Callable[[Any], None] | None = None  # family-specific config checks (raise naming the key)
    # A typed section (pydantic, unknown keys rejected) for the family's own `model.options` keys.
    options: type[BaseModel] | None = None
    # Objective settings this family defaults to when the config does not set them (ModernBERT: 30% masking).
    objective_defaults: dict[str, Any] = field(default_factory=dict)
    # The attribute holding the MLM prediction head (transform + vocabulary projection) on top of `base_model`,
    # for the MLM objective's sparse prediction; None: the family has none, or predicts sparsely itself.
    mlm_head: str | None = None
    # the pretraining model ('RobertaForMaskedLM' in transformers, 'pkg.mod:Cls')
    model_class: str | type | None = None
    auto_class: str = "AutoModel"  # what loads the export with its pretraining head (parity, reload check)
    # Further Auto classes the exported folder must load with (fine-tuning heads); the export loads each one
    # and records the class it got in training_state.json.
    export_heads: tuple[str, ...] = ("AutoModelForSequenceClassification",)
    # HF config fields the exported folder gets instead of the training ones (e.g. sparse prediction off, so
    # the export returns dense logits as the published checkpoints do).
    export_config: dict[str, Any] = field(default_factory=dict)
    # The oldest transformers release whose model code knows this family (the card states it; the compat test
    # loads the export in it). ModernBERT arrived in 4.48.
    min_transformers: str = "4.40"
    # LoRA target modules for peft where peft has no default for this model_type (the card names them; peft
    # otherwise stops with "Please specify `target_modules`"). Empty: peft's own default.
    lora_target_modules: tuple[str, ...] = ()
    # `finetune` settings this family fine-tunes with where the config does not set them (FinetuneRecipe).
    finetune_defaults: dict[str, Any] = field(default_factory=dict)
    # LoRA (`finetune.methods: [lora]`, through peft): the head modules trained and saved whole beside the
    # adapters (peft's modules_to_save; empty: peft's default for the task).
    lora_modules_to_save: tuple[str, ...] = ()
    # μP (`model.parametrization: mup`, pretrain/run/mup.py): (the norm whose output the readout reads, the readout
    # linear), as module paths of the pretraining model; None: the family has no μP.
    mup_readout: tuple[str, str] | None = None
    # --- implementation (given with the data in the family's own module)
    # (model section, tokenizer, padded vocab size) -> a transformers PretrainedConfig. The sequence length is
    # checked against the position table where the model is built (FamilySpec.position_limit), not here.
    build_config: Callable[[Any, Any, int], Any] | None = None
    probe_inputs: Callable[[Any, list[str]], dict[str, Any]] = default_probe_inputs
    attention_layers: Callable[[Any], int] = attention_layers  # layers whose attention FLOPs count
    flops_per_token: Callable[[FamilySpec, Any, int, int], float] = default_flops_per_token
    # (run config) -> (total parameters, largest module's), from the config alone (pretrain/families/shapes.py):
    # `pretrain plan` prints it without importing torch. None: plan builds the model on the meta device.
    param_count: Callable[[Any], tuple[int, int]] | None = None
    # FP8 training (`model.float8`, pretrain/run/float8.py): (model section) -> {module path inside one repeated
    # block: (in_features, out_features)} of the block's nn.Linear layers that torchao converts. Config validation
    # checks each width; the conversion checks that it found exactly these in every block. None: no FP8 path.
    float8_linears: Callable[[Any], dict[str, tuple[int, int]]] | None = None
    # --- data: replaced-token detection (the `electra` objective) on this family: 'module:NAME' of its
    # `pretrain.objectives.rtd.RTDFamily` (how it builds a discriminator and a same-family generator sharing its
    # embeddings, and exports them). None: the family cannot carry RTD, and a config asking for it is refused.
    rtd: str | None = None

    def __post_init__(self) -> None:
        if self.finetune_defaults:
            check_finetune_recipe(self.name, self.finetune_defaults)

    def model_cls(self) -> type:
        if self.model_class is None:
            raise ValueError(f"model.family '{self.name}' names no model class")
        return resolve(self.model_class)

    def auto_cls(self, name: str | None = None) -> type:
        return resolve(name or self.auto_class)

    def position_limit(self, max_position_embeddings: int) -> int | None:
        """The longest sequence the position table allows (None: unbounded by the table)."""
        return None if self.reserved_positions is None else max_position_embeddings - self.reserved_positions

    def trains(self, objective: ObjectiveSpec) -> bool:
        return objective.name in self.objectives or (objective.trains is not None and objective.trains(self))


# ---------------------------------------------------------------------------------------------------- objectives


def same_length(seq_len: int, objective: Any) -> int:
    return seq_len


@dataclass(frozen=True)
class ObjectiveSpec:
    # --- data
    name: str
    packing: tuple[str, ...]  # packing.mode values it fits
    # --- implementation (data_pipeline/objectives/: the collator side; pretrain/objectives/: the model side)
    # (run config, HF tokenizer) -> callable(list of packed samples) -> the model's forward kwargs as tensors.
    build_collator: Callable[[Any, Any], Callable[[list[dict[str, Any]]], dict[str, Any]]] | None = None
    # Stream tokens one packed block holds for `packing.seq_len` model inputs (T5 spans: the raw length the
    # corruption shrinks to seq_len); computed once at packing time.
    block_length: Callable[[int, Any], int] = same_length
    wrap_bos: bool = True  # line_by_line framing: `<s> doc </s>` (MLM) or `doc </s>` (causal)
    # Settings the objective relies on, applied once to the built model (GPT document masking: use_cache=False).
    prepare_model: Callable[[Any, Any], None] | None = None
    # Objectives that wrap the family's model (a generator + discriminator pair) return the module to train:
    # (cfg, family model, tokenizer) -> module; None: the family's model is trained as built.
    wrap_model: Callable[[Any, Any, Any], Any] | None = None
    # Objectives with their own export (e.g. two HF folders) write it: (cfg, trained module, out dir, tokenizer)
    # -> the export reloaded from disk as a module whose probe logits must match the engine's (parity), or None.
    export: Callable[[Any, Any, Any, Any], Any] | None = None
    # --- data
    # Families this objective trains beyond those that list it in FamilySpec.objectives (a plug-in objective
    # need not edit family files): (family spec) -> bool.
    trains: Callable[[Any], bool] | None = None
    validate: Callable[[Any], None] | None = None  # objective-specific config checks (raise naming the key)
    # A typed section (pydantic, unknown keys rejected) for the objective's own `objective.options` keys.
    options: type[BaseModel] | None = None
    # The objective reads every position with a bidirectional encoder (replaced-token detection): a family whose
    # spec says has_encoder=False is refused at load with that reason.
    needs_encoder: bool = False
    # The model card's task for this objective's export whatever the family's (RTD on ModernBERT exports an
    # encoder body, not a masked-LM head): a key of pretrain.export.model_card.TASKS; None: the family's task.
    card_task: str | None = None
    # Work beyond one forward and backward of the trained module per token, for the FLOPs count (MFU, `plan`):
    # (cfg, the trained module, possibly on the meta device) -> (matmul weights run again, the fraction of each
    # sequence they run on). SCL runs the discriminator again on a cropped view; None: nothing run twice.
    rerun: Callable[[Any, Any], tuple[int, float]] | None = None

    def parse_options(self, options: dict[str, Any]) -> Any:
        """`objective.options` as the spec's typed section, defaults filled in (None if it has none)."""
        return None if self.options is None else self.options.model_validate(options)


# ---------------------------------------------------------------------------------------- adaptation methods


@dataclass(frozen=True)
class MethodSpec:
    """An adaptation method (`finetune.methods`, run for every arm of the transfer protocol): its name, its typed
    `finetune.<name>` settings, how it trains, what it saves and what its result is called. The hooks get the
    method's settings (its `settings` section, defaults filled in) and import torch inside themselves, so the
    config reads a spec without any ML framework."""

    # --- data: what config validation, the card, the report and TensorBoard read
    name: str
    # What its result is called on the model card, in the transfer report and TensorBoard ("LoRA adapters").
    description: str
    # A typed section (pydantic, unknown keys rejected) for the method's own `finetune.<name>` keys.
    settings: type[BaseModel] | None = None
    # The method whose results are the task's own `arms` in transfer.json and the card's headline row (full
    # fine-tuning); it alone reports the linear probe and the body's token cosine, and it is the default of
    # `finetune.methods`. Exactly one registered method is primary.
    primary: bool = False
    # The config key(s) its LR grid comes from, for the "picked at the grid's edge" warning.
    lr_grid_text: str = "finetune.lr_grid"
    # --- implementation
    # (finetune.lr_grid, settings) -> the learning rates its dev pick runs over; None: finetune.lr_grid.
    lr_grid: Callable[[list[float], Any], list[float]] | None = None
    # (built classification model, settings, text_to_text) -> the module the Trainer trains (LoRA: peft's
    # wrapper); called after the Trainer seeds torch. None: the model as built.
    wrap_model: Callable[[Any, Any, bool], Any] | None = None
    # (settings, optimizer steps per epoch) -> (Trainer subclass, its extra keyword arguments, extra callbacks):
    # a method with its own optimizer groups or schedule (ULMFiT). None: the Trainer with finetune.optim.
    trainer: Callable[[Any, int], tuple[type, dict[str, Any], list[Any]]] | None = None
    # (out_dir, trained model, export dir, labels, regression, scores) -> None: what it writes into a saved
    # fine-tuned folder beside the Trainer's save_model and the tokenizer (LoRA: the adapters' model card).
    save: Callable[[Any, Any, Any, list[str], bool, dict[str, float]], None] | None = None
    # (prepared task, arm, task name, settings, log) -> the arm's transfer.json entry, for a method that runs its
    # own protocol instead of Trainer fine-tunes (the frozen body's probes); such a method saves no folder, so
    # `adapt finetune` skips it.
    evaluate_arm: Callable[[Any, str, str, Any, Callable[[str], None]], dict[str, Any]] | None = None
    # (an arm's transfer.json entry) -> more text for its line in the printed report ("" for none).
    report_text: Callable[[dict[str, Any]], str] | None = None

    def parse_settings(self, settings: dict[str, Any] | BaseModel | None) -> Any:
        """`finetune.<name>` as the spec's typed section, defaults filled in (None if it has none)."""
        if self.settings is None or isinstance(settings, self.settings):
            return settings
        return self.settings.model_validate(settings or {})
