"""Data sources, cleaning and dedup sections."""

from typing import Literal

from pydantic import Field, model_validator

from runconfig.base import Section

SourceFormat = Literal["warc", "wet", "jsonl", "parquet", "text", "text_folder", "hf_dataset"]


class SourceConfig(Section):
    name: str
    format: SourceFormat
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


class UnicodeConfig(Section):
    enabled: bool = True
    fix_text: bool = True  # ftfy mojibake repair
    normalization: Literal["NFC", "NFKC", "none"] = "NFC"


class ExtractConfig(Section):
    """trafilatura options for HTML -> main text (WARC sources)."""

    favor_precision: bool = True
    include_tables: bool = True
    fast: bool = True  # skip trafilatura's readability/jusText fallbacks (several times faster)
    deduplicate: bool = False
    timeout_s: float = Field(5.0, ge=0)  # per page; 0 = no limit


class C4Config(Section):
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


class GopherQualityConfig(Section):
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


class GopherRepetitionConfig(Section):
    enabled: bool = True
    dup_line_frac: float = 0.3
    dup_para_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    dup_para_char_frac: float = 0.2
    top_n_grams: list[tuple[int, float]] = [(2, 0.2), (3, 0.18), (4, 0.16)]
    dup_n_grams: list[tuple[int, float]] = [(5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)]


class LangIdConfig(Section):
    enabled: bool = True
    languages: list[str] = ["en"]
    threshold: float = Field(0.65, ge=0, le=1)


class CleanConfig(Section):
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
    unicode: UnicodeConfig = UnicodeConfig()
    c4: C4Config = C4Config()
    gopher_quality: GopherQualityConfig = GopherQualityConfig()
    gopher_repetition: GopherRepetitionConfig = GopherRepetitionConfig()
    langid: LangIdConfig = LangIdConfig()


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
    merge_fan_in: int = Field(8, ge=2)  # duplicate-edge files merged per connected-components task


class RayConfig(Section):
    address: str = "auto"  # what ray.init takes: auto | host:port | ray://host:10001; local: a Ray here
    num_cpus_per_task: float = Field(1.0, gt=0)


class DataConfig(Section):
    sources: list[SourceConfig] = Field(min_length=1)
    clean: CleanConfig = CleanConfig()
    dedup: DedupConfig = DedupConfig()
    # Who runs the tasks of a data stage: a local process pool (data.clean.workers) or a Ray cluster.
    executor: Literal["local", "ray"] = "local"
    ray: RayConfig = RayConfig()
    task_retries: int = Field(2, ge=0)  # a failed task is retried this many times, then reported by name
    # A JSONL / WARC / Parquet input larger than this is read as several record-aligned byte ranges (row groups
    # for Parquet), each its own cleaning task. None: one task per file.
    max_task_bytes: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _unique_names(self) -> "DataConfig":
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"data.sources: duplicate source name(s) {dupes}")
        return self
