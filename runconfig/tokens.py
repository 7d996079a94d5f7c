"""Tokenizer, token-shard, packing and loader sections."""

from typing import Literal

from pydantic import Field

from runconfig.base import Section


class TokenizerConfig(Section):
    type: Literal["bpe", "wordpiece", "unigram"] = "bpe"
    vocab_size: int = Field(8000, ge=256)
    min_frequency: int = Field(2, ge=1)
    lowercase: bool = False
    # Cap on documents streamed into the trainer (None = all cleaned documents).
    max_train_docs: int | None = None
    # Load an existing HF tokenizer folder instead of training one.
    pretrained_path: str | None = None


class ShardsConfig(Section):
    workers: int = Field(2, gt=0)
    sentence_splitter: Literal["pysbd", "none"] = "pysbd"


PackingMode = Literal["full_sentences", "contiguous", "t5_spans", "line_by_line"]


class PackingConfig(Section):
    mode: PackingMode = "full_sentences"
    seq_len: int = Field(128, ge=8)


class LoaderConfig(Section):
    num_workers: int = Field(1, ge=0)
    prefetch_factor: int = Field(2, ge=1)
    # Fraction of packed samples held out for periodic evaluation (by sample id, never trained on).
    eval_fraction: float = Field(0.02, ge=0, lt=0.5)
    cache_dir: str | None = None  # local cache for remote (fsspec) shards
