"""Data sources, cleaning and dedup sections."""

import os
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from core.errors import UnknownNameError
from core.plugin_code import is_ref
from core.registry import EXECUTORS, FILTERS, READERS
from core.specs import Options
from runconfig.base import PathComponent, Section
from runconfig.filters import builtin_steps, preset_overrides, setting_names, step_settings

# Settings of the whole stage, not of one source's documents.
STAGE_KEYS = ("docs_per_shard", "workers", "output_format", "progress", "dropped_samples_per_reason")

# Named per-source cleaning presets (data.sources.N.clean_preset), applied over the global `clean:` section. What a
# preset sets in a step's section, the step declares (its `presets` attribute, runconfig/filters.py).
# web: the global rules as they are (C4 + Gopher + language ID, tuned for web crawl).
# curated: books, verse, reviews, edited corpora: no quality rules or language ID (unicode repair, PII redaction,
#   URL blocklists and decontamination still run). C4's terminal-punctuation and sentence rules cut verse to
#   fragments, Gopher's minimum length and n-gram repetition drop every one-line review, and language ID is
#   unreliable on short text.
CLEAN_PRESETS = ("web", "curated")


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class SourceConfig(Section):
    name: PathComponent
    # A built-in reader or one an installed package registers (entry point group `lmstack.readers`).
    format: str
    # Local paths, globs or fsspec URLs. `{prefix}` expands to sys.prefix (where `pip install` puts package data),
    # `{site_packages}` to the purelib folder, and $VARS to environment variables.
    paths: list[str] = Field(min_length=1)
    weight: float = Field(1.0, gt=0)
    text_field: str = "text"
    # Deterministic per-document hold-out (by id hash): these documents never reach pretraining and are what
    # `finetune` uses, so a downstream evaluation never sees text the model was pretrained on.
    holdout_fraction: float = Field(0.0, ge=0, lt=1)
    # text_folder: the sub-folder name is the document's label (kept in metadata for fine-tuning).
    label_from_folder: bool = False
    # Cleaning for this source: a named preset (web | curated) and/or overrides of any key of `data.clean`
    # (a filter's switch or threshold, `filters:`, `min_chars`, ...), applied over the global `clean:`.
    clean_preset: Literal["web", "curated"] | None = None
    clean: dict[str, Any] = {}

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        known = READERS.entry_point_names()
        if v not in known and not is_ref(v):
            raise ValueError(
                f"unknown format {v!r}; known: {sorted(known)} (a package adds one through the "
                f"'{READERS.group}' entry point group)"
            )
        return v


class FilterSpec(Section):
    """One step of `data.clean.filters`: a registered filter and its parameters (a plain name is accepted)."""

    name: str
    params: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        known = FILTERS.entry_point_names()
        if v not in known and not is_ref(v):
            raise ValueError(
                f"unknown filter {v!r}; known: {sorted(known)} (a package adds one through the "
                f"'{FILTERS.group}' entry point group)"
            )
        return v

    @field_validator("params")
    @classmethod
    def _typed(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """A built-in's params are checked against its settings (its constructor's; each key overrides the same
        key of its section); an outside filter's, when the clean stage starts (its package is imported there)."""
        name = info.data.get("name", "")
        if name in builtin_steps():
            settings = step_settings(name)
            try:
                settings.model_validate(v)
            except ValidationError as e:
                err = e.errors()[0]
                key = ".".join(str(p) for p in err["loc"])
                raise ValueError(
                    f"{key}: {err['msg'].removeprefix('Value error, ')} ({name} takes {setting_names(settings)})"
                ) from None
        return v


def _step_sections(data: dict[str, Any], own: set[str]) -> tuple[dict[str, Any], list[InitErrorDetails]]:
    """`data` with each step's section validated against its settings (a built-in's default where absent), and
    the errors, located under the section (`c4.min_num_sentences`); a key that is neither a field nor a
    registered step is an unknown key."""
    out, errors = dict(data), []
    steps = FILTERS.entry_point_names()
    for key, value in data.items():
        if key in own:
            continue
        if key not in steps:
            errors.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=value))
            continue
        if isinstance(value, Options):
            continue
        try:
            out[key] = step_settings(key).model_validate(value)
        except ValidationError as e:
            errors += [
                InitErrorDetails(
                    type=er["type"], loc=(key, *er["loc"]), input=er["input"], ctx=er.get("ctx", {})
                )
                for er in e.errors()
            ]
    for name in builtin_steps():
        out.setdefault(name, step_settings(name)())
    return out, errors


class ExtractConfig(Section):
    """trafilatura options for HTML -> main text (WARC sources)."""

    favor_precision: bool = True
    include_tables: bool = True
    fast: bool = True  # skip trafilatura's readability/jusText fallbacks (several times faster)
    deduplicate: bool = False
    timeout_s: float = Field(5.0, ge=0)  # per page; 0 = no limit


class CleanConfig(Section):
    # Which steps (filters and formatters) run, in which order, with which parameters, e.g.
    # [unicode, {name: c4, params: {min_num_sentences: 3}}, {name: my_filter, params: {limit: 5}}].
    # A registered step takes its settings from its section, `data.clean.<step>` (params override them); null =
    # the built-ins in their default order (their entry points' order). Every section's `enabled` switch applies.
    # `{defaults: true, extra: [...]}` runs the built-ins first, then the extra ones; a plain list replaces the
    # built-ins (the clean stage says so when it leaves all of them out).
    filters: list[FilterSpec] | None = None
    docs_per_shard: int = Field(2000, gt=0)
    workers: int = Field(2, gt=0)
    output_format: Literal["jsonl.zst", "parquet"] = "jsonl.zst"
    min_chars: int = 0
    max_doc_bytes: int = Field(10_000_000, gt=0)
    # A read that delivers nothing for this long (hung mount, silent remote store) is reported and skipped.
    read_timeout_s: float = Field(300.0, ge=0)  # 0 = no limit
    dropped_samples_per_reason: int = 5
    progress: bool = True  # tqdm bar over shards
    extract: ExtractConfig = ExtractConfig()

    # Beside these keys, each registered step's section, `data.clean.<step>`: its `enabled` switch and its
    # constructor's settings, derived from its declaration (runconfig/filters.py) and validated by `_sections`; a
    # key that is neither is refused. The reference lists them, one table per built-in step.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="wrap")
    @classmethod
    def _sections(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> "CleanConfig":
        if isinstance(data, dict):
            data, errors = _step_sections(data, set(cls.model_fields))
            if errors:
                raise ValidationError.from_exception_data(cls.__name__, errors)
        return handler(data)

    @classmethod
    def extra_sections(cls) -> dict[str, type[Options]]:
        """The steps' sections beside the fields (the built-ins'), for the loader's unknown-key hints."""
        return {name: step_settings(name) for name in builtin_steps()}

    if TYPE_CHECKING:  # a step's section is an attribute too (`clean.c4`), typed by its step, not here

        def __getattr__(self, name: str) -> Any: ...

    def section(self, name: str) -> Options | None:
        """A registered step's section (None for a `module:Name` step, which has none)."""
        sec = (self.__pydantic_extra__ or {}).get(name)
        if sec is None and name in FILTERS.entry_point_names():
            sec = step_settings(name)()
        return sec

    @field_validator("filters", mode="before")
    @classmethod
    def _extend_defaults(cls, v: Any) -> Any:
        """`{defaults: bool, extra: [...]}` -> the list it means."""
        if not isinstance(v, dict):
            return v
        unknown = sorted(set(v) - {"defaults", "extra"})
        if unknown:
            raise ValueError(
                f"takes a list, or {{defaults: true|false, extra: [...]}}; unknown key(s) {unknown}"
            )
        extra = v.get("extra") or []
        if not isinstance(extra, list):
            raise ValueError("extra: a list of filters")
        return [*(builtin_steps() if v.get("defaults", True) else ()), *extra]


class EvalSetSpec(Section):
    """One file of evaluation text to keep out of pretraining: JSONL (`text_field`, optional `id`), CSV/TSV (a
    `text_field` column) or text (one example a line). A plain path is accepted; `auto` reads the suffix."""

    path: str
    format: Literal["auto", "jsonl", "csv", "tsv", "text"] = "auto"
    text_field: str = "text"

    @model_validator(mode="before")
    @classmethod
    def _from_path(cls, v: Any) -> Any:
        return {"path": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _readable(self) -> "EvalSetSpec":
        from core.paths import expand_placeholders  # here: loading a config imports no fsspec otherwise

        p = expand_placeholders(self.path)
        if os.path.isdir(p):
            raise ValueError(
                f"evaluation file '{self.path}' is a directory (expanded to '{p}'): name a file in it"
            )
        if not os.path.isfile(p):
            raise ValueError(f"evaluation file '{self.path}' does not exist (expanded to '{p}')")
        if self.format == "auto":
            name = p.lower().removesuffix(".gz")
            fmt: Literal["jsonl", "csv", "tsv", "text"] | None = next(
                (f for f, sfx in _EVAL_SUFFIXES.items() if name.endswith(sfx)), None
            )
            if fmt is None:
                raise ValueError(
                    f"cannot tell the format of evaluation file '{self.path}' (known: "
                    f"{', '.join(f'{k} ({v})' for k, v in _EVAL_SUFFIXES.items())}): set its format"
                )
            self.format = fmt
        return self


_EVAL_SUFFIXES: dict[Literal["jsonl", "csv", "tsv", "text"], str] = {
    "jsonl": ".jsonl",
    "csv": ".csv",
    "tsv": ".tsv",
    "text": ".txt",
}


class DecontaminateConfig(Section):
    """N-gram decontamination (GPT-3's 13-grams, datatrove's NGramsDecontFilter): a crawl document sharing one
    normalised n-gram with an evaluation text is dropped, and reported with the n-gram and the example's id."""

    enabled: bool = True
    n: int = Field(13, ge=1)
    # The dev and test text of every finetune.tasks entry, automatically (a task's test set leaking into
    # pretraining inflates its transfer margin).
    tasks: bool = True
    sources: list[EvalSetSpec] = []  # more evaluation text, from files


class MinHashConfig(Section):
    enabled: bool = True
    ngram: int = Field(5, gt=0)
    bands: int = Field(14, gt=0)
    rows: int = Field(8, gt=0)
    seed: int = 1


class DedupConfig(Section):
    exact: bool = True
    minhash: MinHashConfig = MinHashConfig()
    # Bucket / exact-hash partitions (hash ranges): 0 = ceil(cleaned documents / docs_per_partition). A bucket
    # task holds one band of one partition (16 bytes per document in it), so this bounds its memory.
    partitions: int = Field(0, ge=0)
    docs_per_partition: int = Field(2_000_000, gt=0)
    merge_fan_in: int = Field(8, ge=2)  # duplicate-edge files merged per first connected-components task
    # Rounds (large-star + small-star, each a stage of `partitions` tasks) of the partitioned connected
    # components; O(log n) suffice (a chain of 2^k copies needs about k). Too few fails naming this key.
    component_rounds: int = Field(12, ge=1)


class RayConfig(Section):
    address: str = "auto"  # what ray.init takes: auto | host:port | ray://host:10001; local: a Ray here
    num_cpus_per_task: float = Field(1.0, gt=0)


# 64 MiB: a few minutes of cleaning on one core (about 150 web documents/s), so a stop loses at most that much
# of a big file, while a task's fixed cost (a process, a marker, a shard file) stays small against it.
DEFAULT_MAX_TASK_BYTES = 64 * 2**20


class DataConfig(Section):
    sources: list[SourceConfig] = Field(min_length=1)
    clean: CleanConfig = Field(default_factory=CleanConfig)
    dedup: DedupConfig = DedupConfig()
    decontaminate: DecontaminateConfig = DecontaminateConfig()
    # Who runs the tasks of a data stage: a local process pool (data.clean.workers), a Ray cluster, or an
    # executor of an outside package (the `lmstack.executors` entry point group), or `module.path:Name`.
    executor: str = "local"
    ray: RayConfig = RayConfig()
    task_retries: int = Field(2, ge=0)  # a failed task is retried this many times, then reported by name
    # Each stage checks the shards it reads against the previous stage's completion markers before any work: sizes
    # always, and sha256 unless this is false (for a run folder on an object store that checksums files itself:
    # hashing means reading every byte).
    verify_checksums: bool = True
    # A JSONL / WARC / Parquet input larger than this is read as several record-aligned byte ranges (row groups
    # for Parquet), each its own cleaning task: the workers share a big file, and a stop keeps every finished
    # piece (a task is the unit a rerun skips). None: one task per file.
    max_task_bytes: int | None = Field(DEFAULT_MAX_TASK_BYTES, gt=0)
    _per_source: dict[str, CleanConfig] = PrivateAttr(default_factory=dict)

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, v: str) -> str:
        known = EXECUTORS.entry_point_names()
        if v not in known and not is_ref(v):  # `module.path:Name`: an executor class in any importable module
            raise UnknownNameError(EXECUTORS.name, EXECUTORS.kind, v, sorted(known))
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> "DataConfig":
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"data.sources: duplicate source name(s) {dupes}")
        self._per_source = {}
        base = self.clean.model_dump(mode="json")
        for i, src in enumerate(self.sources):
            stage = sorted(k for k in src.clean if k in STAGE_KEYS)
            if stage:
                raise ValueError(
                    f"data.sources.{i}.clean: {stage} apply to the whole stage; set them in data.clean"
                )
            merged = _deep_merge(_deep_merge(base, preset_overrides(src.clean_preset or "web")), src.clean)
            try:
                self._per_source[src.name] = CleanConfig.model_validate(merged)
            except ValidationError as e:
                err = e.errors()[0]
                key = ".".join(str(p) for p in err["loc"])
                raise ValueError(
                    f"data.sources.{i}.clean.{key}: {err['msg'].removeprefix('Value error, ')}"
                ) from None
        return self

    def clean_for(self, source: str) -> CleanConfig:
        """The cleaning settings of one source: global `clean:`, its preset, its own overrides."""
        return self._per_source.get(source) or self.clean
