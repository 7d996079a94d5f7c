"""Tokenizer, token-shard, packing and loader sections."""

from typing import Literal

from pydantic import Field, field_validator, model_validator

from core.errors import UnknownNameError
from core.plugin_code import is_ref
from core.registry import TOKENIZER_CONVENTIONS
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
    # Unigram (SentencePiece): share of characters the vocabulary must cover (rarer ones become <unk>), and the
    # number of paragraphs SentencePiece samples into memory (it keeps its training sentences in RAM).
    character_coverage: float = Field(0.9995, gt=0, le=1)
    input_sentence_size: int = Field(2_000_000, gt=0)
    # Unigram: characters outside the vocabulary become UTF-8 byte pieces instead of <unk> (256 of the ids).
    byte_fallback: bool = True
    # After training, <unk> tokens on a sample of the corpus (the first 500 documents, at most 100k tokens:
    # data_pipeline/tokenizers/checks.py) above this share fail.
    max_unk_rate: float = Field(0.001, ge=0, le=1)
    # Special tokens, post-processing and HF class of the saved tokenizer. None: what tokenizer.type and the
    # family imply (bpe: roberta or gpt2, wordpiece: bert, unigram: t5); an outside package's convention by its
    # entry point name (`lmstack.tokenizer_conventions`) or `module.path:Name` (byte-level BPE only).
    convention: str | None = None

    @field_validator("convention")
    @classmethod
    def _known_convention(cls, v: str | None) -> str | None:
        known = TOKENIZER_CONVENTIONS.entry_point_names()
        if v is not None and v not in known and not is_ref(v):
            raise UnknownNameError(TOKENIZER_CONVENTIONS.name, TOKENIZER_CONVENTIONS.kind, v, sorted(known))
        return v

    @model_validator(mode="after")
    def _byte_room(self) -> "TokenizerConfig":
        if self.type == "unigram" and self.byte_fallback and self.vocab_size < 512:
            raise ValueError(
                f"tokenizer.vocab_size: {self.vocab_size} leaves no room for the 256 byte pieces and 100 sentinels "
                "of a byte-fallback Unigram vocabulary (>= 512), or set tokenizer.byte_fallback=false"
            )
        if (
            self.convention is not None
            and self.type != "bpe"
            and self.convention not in TOKENIZER_CONVENTIONS.builtin_names()
        ):
            raise ValueError(
                f"tokenizer.convention: {self.convention!r} applies to byte-level BPE "
                f"(tokenizer.type bpe), not {self.type!r}"
            )
        return self


class ShardsConfig(Section):
    workers: int = Field(2, gt=0)
    # blingfire (FSM, C++; ~30x faster than pysbd at similar quality on news text), pysbd (rule-based, pure
    # Python), none (no sentence index), or auto: blingfire when packing.mode is full_sentences (the only mode that
    # reads sentences), else none. Newlines always split.
    sentence_splitter: Literal["auto", "blingfire", "pysbd", "none"] = "auto"


PackingMode = Literal["full_sentences", "contiguous", "t5_spans", "line_by_line"]


class PackingConfig(Section):
    mode: PackingMode = "full_sentences"
    seq_len: int = Field(128, ge=8)
    # full_sentences: "best_fit" holds whole sentences only and fills each block's tail with the next sentences of
    # a following document (~0.7% padding at seq_len 512 on news text, ~4% at 128); "complete" ends every block at
    # a sentence boundary and pads the rest (fairseq's --sample-break-mode complete; ~3% at 512, ~12% at 128);
    # "fill" cuts the stream every block (only the sentence crossing a block edge is split; no padding);
    # "auto": best_fit when its padding is <= 1%, else fill.
    sentence_break: Literal["auto", "best_fit", "complete", "fill"] = "auto"


class LoaderConfig(Section):
    num_workers: int = Field(1, ge=0)
    # Token shards are checked against tokens/manifest.json before training: sizes always, and sha256 unless this
    # is false (for shards on an object store that checksums them itself: hashing means reading every byte).
    verify_checksums: bool = True
    prefetch_factor: int = Field(2, ge=1)
    # Fraction of packed samples held out for periodic evaluation (by sample id, never trained on).
    eval_fraction: float = Field(0.02, ge=0, lt=0.5)
    cache_dir: str | None = None  # local cache for remote (fsspec) shards
    # Where token shards are read from: None = <run>/tokens; or an fsspec URL (s3://, gs://, memory://, file://)
    # holding the same layout, copied on first use into cache_dir.
    tokens_url: str | None = None
    shuffle: bool = True
    # How source weights mix: "scale" draws round(weight x packed samples) per epoch from each source (weight 1 =
    # natural size), "proportion" makes weights the shares of an epoch of the same total length.
    mixing: Literal["scale", "proportion"] = "scale"
