"""The spec types: what the config validates names and combinations against (torchtitan's `protocols/` style:
plain dataclasses), and nothing per plug-in.

A `FamilySpec` says, per model family, which objectives it trains, which tokenizer conventions its special
tokens assume, how many positions its table reserves, whether it has an encoder or a decoder, its typed
`model.options`, its config checks and the functions that build it. An `ObjectiveSpec` says which packing modes
fit an objective, its framing, its typed `objective.options`, checks and hooks. Every spec, built-in or outside,
is one module that gives the whole spec (data and implementation, heavy imports inside the functions) and one
entry point naming it: the built-ins' are in pyproject.toml (core/registry.py reads them).

The names of the built-in readers, executors and tokenizer conventions are data here too (`BUILTIN_FORMATS`,
...): the config validates `format:` and the others against them plus the entry point names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# ---------------------------------------------------------------------------------------------- readers, filters

BUILTIN_FORMATS = ("warc", "wet", "jsonl", "csv", "tsv", "parquet", "text", "text_folder", "hf_dataset")
BUILTIN_EXECUTORS = ("local", "ray")
# Tokenizer conventions (special tokens, post-processing, HF class of a saved tokenizer): by default the one
# `tokenizer.type` and the family imply; `tokenizer.convention` names one (an outside one: entry point or ref).
BUILTIN_CONVENTIONS = ("roberta", "gpt2", "bert", "t5")


class Options(BaseModel):
    """Base of a spec's typed options section: unknown keys are errors (as every config section)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False
    )


# ------------------------------------------------------------------------------- filters' typed settings (data)
# A filter's settings are a typed section (unknown keys rejected): the built-ins' live here, as data the config
# validates against (`data.clean.<section>` and a `filters:` step's `params`); an outside filter brings its own
# as the `settings` attribute of its factory (checked when the clean stage starts, before any work).


class UnicodeConfig(Options):
    enabled: bool = True
    fix_text: bool = True  # ftfy mojibake repair
    normalization: Literal["NFC", "NFKC", "none"] = "NFC"


class C4Config(Options):
    enabled: bool = True
    split_paragraph: bool = True
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    min_num_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True
    filter_bad_words: bool = False


class GopherQualityConfig(Options):
    enabled: bool = True
    min_doc_words: int = 50
    max_doc_words: int = 100_000
    min_avg_word_length: float = 3
    max_avg_word_length: float = 10
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    max_non_alpha_words_ratio: float = 0.8
    min_stop_words: int = 2


class GopherRepetitionConfig(Options):
    enabled: bool = True
    dup_line_frac: float = 0.3
    dup_para_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    dup_para_char_frac: float = 0.2
    top_n_grams: list[tuple[int, float]] = [(2, 0.2), (3, 0.18), (4, 0.16)]
    dup_n_grams: list[tuple[int, float]] = [(5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)]


class LangIdConfig(Options):
    enabled: bool = True
    languages: list[str] = ["en"]
    threshold: float = Field(0.65, ge=0, le=1)


class FineWebQualityConfig(Options):
    """datatrove's FineWebQualityFilter thresholds (the FineWeb recipe's). Off by default: on top of C4 and Gopher
    the duplicated-line rule alone removes a sizeable share of a crawl; switch it on for FineWeb's recipe."""

    enabled: bool = False
    line_punct_thr: float = Field(0.12, ge=0, le=1)
    line_punct_exclude_zero: bool = False
    short_line_thr: float = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    char_duplicates_ratio: float = Field(0.01, ge=0, le=1)
    new_line_ratio: float = Field(0.3, ge=0)


def _existing_files(paths: list[str]) -> list[str]:
    import os

    from core.paths import expand_placeholders  # here: loading a config imports no fsspec otherwise

    for raw in paths:
        full = expand_placeholders(raw)
        if not os.path.isfile(full):
            raise ValueError(f"blocklist file '{raw}' does not exist (expanded to '{full}')")
    return paths


class UrlFilterConfig(Options):
    """Blocklists (files, one entry a line, `#` comments) checked against each document's URL, with datatrove's
    URLFilter rules. With no list given there is nothing to check and the filter does not run."""

    enabled: bool = True
    blocked_domains: list[str] = []  # a listed domain blocks itself and every subdomain of it
    blocked_urls: list[str] = []  # exact URLs
    banned_words: list[str] = []  # a word of the URL (split on non-alphanumerics) on the list
    soft_banned_words: list[str] = []  # at least soft_word_threshold of these words in the URL
    soft_word_threshold: int = Field(2, ge=1)
    banned_subwords: list[str] = []  # a substring of the URL with non-alphanumerics removed, lowercased

    @field_validator(
        "blocked_domains", "blocked_urls", "banned_words", "soft_banned_words", "banned_subwords"
    )
    @classmethod
    def _files_exist(cls, v: list[str]) -> list[str]:
        return _existing_files(v)

    def active(self) -> bool:
        """Whether the filter runs (the report's `enabled`): switched on and given at least one list."""
        lists = (self.blocked_domains, self.blocked_urls, self.banned_words, self.soft_banned_words,
                 self.banned_subwords)  # fmt: skip
        return self.enabled and any(lists)


PII_KINDS = ("email", "ip", "phone")


class PiiConfig(Options):
    """PII redaction (a formatter: it rewrites text, never drops a document). On by default: emails, public IP
    addresses and phone numbers in published web text identify people and teach a model nothing it needs."""

    enabled: bool = True
    kinds: list[Literal["email", "ip", "phone"]] = list(PII_KINDS)
    only_public_ips: bool = True  # as datatrove: private, loopback, documentation ... addresses are kept
    email_replacement: str = "email@example.com"
    ipv4_replacement: str = "192.0.2.1"  # TEST-NET-1 (RFC 5737): reserved, never anyone's address
    ipv6_replacement: str = "2001:db8::1"  # the IPv6 documentation prefix (RFC 3849)
    phone_replacement: str = "555-0100"  # the NANP block reserved for fiction


@dataclass(frozen=True)
class FilterKind:
    """A filter as data: its name, the type of its settings and the `data.clean` key of its section."""

    name: str
    settings: type[BaseModel] | None = None
    section: str | None = None  # built-ins: `data.clean.<section>` holds the settings their params override


# The built-in filters in their default order: URL blocklists (cheapest, on the URL alone), unicode repair, language
# ID, Gopher repetition + quality, C4 (it edits lines), FineWeb (after C4, as in the FineWeb recipe), then PII
# redaction, which rewrites only the text that is kept.
BUILTIN_FILTER_KINDS = (
    FilterKind("url", UrlFilterConfig, "url"),
    FilterKind("unicode", UnicodeConfig, "unicode"),
    FilterKind("langid", LangIdConfig, "langid"),
    FilterKind("gopher_repetition", GopherRepetitionConfig, "gopher_repetition"),
    FilterKind("gopher_quality", GopherQualityConfig, "gopher_quality"),
    FilterKind("c4", C4Config, "c4"),
    FilterKind("fineweb", FineWebQualityConfig, "fineweb"),
    FilterKind("pii", PiiConfig, "pii"),
)
BUILTIN_FILTERS = tuple(k.name for k in BUILTIN_FILTER_KINDS)


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
    # encoder body, not a masked-LM head): a key of pretrain.model_card.TASKS; None: the family's task.
    card_task: str | None = None

    def parse_options(self, options: dict[str, Any]) -> Any:
        """`objective.options` as the spec's typed section, defaults filled in (None if it has none)."""
        return None if self.options is None else self.options.model_validate(options)
