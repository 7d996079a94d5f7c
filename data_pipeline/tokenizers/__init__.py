"""Train the run's tokenizer from the cleaned corpus and save it as a folder `AutoTokenizer` loads.

Four conventions (CONVENTIONS), each with the special tokens, post-processing and HF class its model expects:
- roberta (byte-level BPE): `<s> <pad> </s> <unk> <mask>` = ids 0..4, `<s> A </s></s> B </s>`.
- gpt2 (byte-level BPE): `<|endoftext|>` = id 0 as bos/eos/unk and pad, left padding (batched generation), no
  specials added (EOS goes between documents at packing time).
- bert (WordPiece): `[PAD] [UNK] [CLS] [SEP] [MASK]` = ids 0..4, `[CLS] A [SEP] B [SEP]`, optional lower-casing.
- t5 (SentencePiece Unigram): `<pad>`=0 `</s>`=1 `<unk>`=2, `<extra_id_0..99>` as the last 100 ids, `A </s>`; byte
  fallback by default (a character outside the vocabulary becomes its UTF-8 bytes, never `<unk>`).

The saved folder loads with transformers 4.40 and newer, 5.x included (SUPPORTED_TRANSFORMERS): its
`tokenizer_config.json` names a class both know (`RobertaTokenizer`, `GPT2Tokenizer`, `BertTokenizer`: 4.x loads
their `*Fast` variant, 5.x its tokenizers-backed class; T5: the generic `PreTrainedTokenizerFast`, which keeps byte
fallback in 5.x) and lists extra special tokens under the key both read. After training, the `<unk>` rate on a sample of the corpus is reported in
`training_meta.json` and training fails above `tokenizer.max_unk_rate` (byte-level BPE: checked on the vocabulary,
which must hold all 256 bytes).

BPE and WordPiece use the `tokenizers` trainers. Unigram uses the `sentencepiece` trainer: it is the
implementation T5's vocabulary came from (same EM + pruning, nmt_nfkc normalisation whose compiled charsmap we
carry over verbatim), multi-threaded, and it bounds memory by sampling `input_sentence_size` paragraphs, whereas
the `tokenizers` Unigram trainer keeps every distinct word of the whole stream in memory. The trained model is
converted to a `tokenizers` Unigram (the same steps as transformers' T5Converter) so the fast path encodes
identically (checked in tests against the sentencepiece processor).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from core.io import replace_dir
from core.log import get_logger
from core.registry import FAMILIES, TOKENIZER_CONVENTIONS
from data_pipeline.tokenizers.corpus import iter_texts, require_texts, verify_corpus
from runconfig import RunConfig

log = get_logger(__name__)

BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]
NUM_SENTINELS = 100
EOT = "<|endoftext|>"
# Oldest transformers the exported tokenizer and model folders are tested with (tests/pretrain/test_export_compat.py).
SUPPORTED_TRANSFORMERS = ">=4.40"


@dataclass(frozen=True)
class Convention:
    """How one kind of tokenizer is saved: the special tokens trained in (ids 0..n-1; T5's sentinels go last),
    the HF special-token kwargs, and a `tokenizer_class` that transformers 4.40+ and 5.x both resolve."""

    specials: list[str]
    hf_tokens: dict[str, Any]
    tokenizer_class: str
    padding_side: str = "right"
    # Byte-level BPE: the tokens added after training (a str is added as a special AddedToken), and whether
    # encoding wraps a sequence as `cls A sep` (`cls A sep sep B sep`, RoBERTa) or adds nothing (GPT-2).
    added_tokens: tuple[str | AddedToken, ...] = ()
    wraps: bool = False
    model_input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    # the saved config carries `do_lower_case` (BERT's classes re-lowercase without it)
    lowercase_flag: bool = False


# name -> Convention (core.registry; outside packages: an entry point group)
CONVENTIONS = TOKENIZER_CONVENTIONS


def register_convention(name: str, conv: Convention) -> None:
    TOKENIZER_CONVENTIONS.register(name, conv)


_MASK = AddedToken("<mask>", lstrip=True, special=True)
register_convention("roberta", Convention(
    BPE_SPECIALS,
    dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
         mask_token=_MASK),
    "RobertaTokenizer", added_tokens=(_MASK,), wraps=True))  # fmt: skip
# GPT-2 has one special token; pad = EOS with left padding is what batched `generate` expects.
register_convention("gpt2", Convention(
    [EOT], dict(bos_token=EOT, eos_token=EOT, unk_token=EOT, pad_token=EOT), "GPT2Tokenizer", padding_side="left",
    added_tokens=(EOT,)))  # fmt: skip
register_convention("bert", Convention(
    WORDPIECE_SPECIALS,
    dict(cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]"),
    "BertTokenizer", model_input_names=("input_ids", "token_type_ids", "attention_mask"),
    lowercase_flag=True))  # fmt: skip
register_convention("t5", Convention(
    T5_SPECIALS,
    dict(eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
         additional_special_tokens=[f"<extra_id_{i}>" for i in range(NUM_SENTINELS)]),
    # transformers 5 rebuilds a T5Tokenizer's pipeline without byte fallback; the generic class loads tokenizer.json
    # as written in both 4.x and 5.x.
    "PreTrainedTokenizerFast"))  # fmt: skip


def describe(cfg: RunConfig) -> str:
    """What `train_tokenizer` will train, in words (stage banners)."""
    tc = cfg.tokenizer
    if tc.pretrained_path:
        return f"(copy the pretrained tokenizer {tc.pretrained_path})"
    kind = {
        "bpe": "byte-level BPE",
        "wordpiece": "WordPiece",
        "unigram": "SentencePiece Unigram" + (" with byte fallback" if tc.byte_fallback else ""),
    }[tc.type]
    return f"{kind}, vocabulary {tc.vocab_size:,}, {convention_name(tc.type, cfg.model.family, tc.convention)} special tokens"


def convention_name(tokenizer_type: str, family: str, chosen: str | None = None) -> str:
    """`tokenizer.convention` when set; else wordpiece -> bert, unigram -> t5, and byte-level BPE follows the
    family's spec: RoBERTa's conventions where the family wraps sequences in `<s> ... </s>`, GPT-2's
    (`<|endoftext|>` only) where it does not."""
    if chosen is not None:
        return chosen
    if tokenizer_type == "bpe":
        return "roberta" if FAMILIES.get(family).wraps_sequences else "gpt2"
    return {"wordpiece": "bert", "unigram": "t5"}[tokenizer_type]


def _batched(texts: Iterator[str], n: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def bpe_tokenizer(
    vocab: dict[str, int] | None = None, merges: list[tuple[str, str]] | None = None
) -> Tokenizer:
    """The byte-level BPE encoding path (GPT-2's regex pre-split + byte alphabet); empty or from vocab+merges."""
    model = models.BPE(vocab, merges) if vocab is not None else models.BPE()
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _bpe_post(tok: Tokenizer, conv: Convention) -> None:
    if conv.wraps:  # RoBERTa-style families: `<s> A </s>`, `<s> A </s></s> B </s>`
        sep, cls = str(conv.hf_tokens["sep_token"]), str(conv.hf_tokens["cls_token"])
        tok.post_processor = processors.RobertaProcessing(
            (sep, tok.token_to_id(sep)),
            (cls, tok.token_to_id(cls)),
            trim_offsets=True,
            add_prefix_space=False,
        )
    else:  # GPT-2 adds no special tokens; offsets still trimmed of the leading space.
        tok.post_processor = processors.ByteLevel(trim_offsets=True)


def _train_bpe(cfg: RunConfig, texts: Iterator[str]) -> Tokenizer:
    tc = cfg.tokenizer
    conv = CONVENTIONS.get(convention_name("bpe", cfg.model.family, tc.convention))
    tok = bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=tc.vocab_size,
        min_frequency=tc.min_frequency,
        special_tokens=conv.specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_batched(texts), trainer=trainer)
    tok.add_special_tokens(
        [t if isinstance(t, AddedToken) else AddedToken(t, special=True) for t in conv.added_tokens]
    )
    _bpe_post(tok, conv)
    return tok


# ---------------------------------------------------------------------------------------------------- WordPiece
def _train_wordpiece(cfg: RunConfig, texts: Iterator[str]) -> Tokenizer:
    tc = cfg.tokenizer
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, lowercase=tc.lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=tc.vocab_size,
        min_frequency=tc.min_frequency,
        special_tokens=WORDPIECE_SPECIALS,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(_batched(texts), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


# ---------------------------------------------------------------------------------------------------- Unigram
def _paragraphs(texts: Iterator[str], max_bytes: int) -> Iterator[str]:
    """SentencePiece trains on lines; paragraphs keep context, and over-long ones are cut (it would skip them)."""
    short = max_bytes // 4  # UTF-8 takes at most 4 bytes a character: shorter paragraphs need no byte count
    for text in texts:
        for para in text.split("\n"):
            para = para.strip()
            if len(para) <= short:
                if para:
                    yield para
                continue
            while para:
                chunk = para.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
                if len(chunk) < len(para):  # cut at the last space inside the limit
                    cut = chunk.rfind(" ")
                    chunk = chunk[:cut] if cut > 0 else chunk
                yield chunk
                para = para[len(chunk) :].strip()


def spm_to_tokenizer(model_proto: bytes, num_sentinels: int = NUM_SENTINELS) -> Tokenizer:
    """SentencePiece Unigram model -> `tokenizers` Unigram with T5's layout (as transformers' T5Converter)."""
    from sentencepiece import sentencepiece_model_pb2 as spm_pb2

    proto = spm_pb2.ModelProto()
    proto.ParseFromString(model_proto)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(num_sentinels - 1, -1, -1)]
    unk_id = proto.trainer_spec.unk_id
    byte_fallback = proto.trainer_spec.byte_fallback
    tok = Tokenizer(models.Unigram(vocab, unk_id=unk_id, byte_fallback=byte_fallback))
    seq = [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), "▁")]
    charsmap = proto.normalizer_spec.precompiled_charsmap
    tok.normalizer = normalizers.Sequence(([normalizers.Precompiled(charsmap)] if charsmap else []) + seq)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    metaspace = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    # <0xE2><0x82><0xAC> -> "€" first, then the word-boundary marks (transformers' SpmConverter does the same).
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), metaspace]) if byte_fallback else metaspace
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in T5_SPECIALS]
        + [AddedToken(f"<extra_id_{i}>", special=True, normalized=False) for i in range(num_sentinels)]
    )
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"], special_tokens=[("</s>", eos)]
    )
    return tok


def train_spm_unigram(cfg: RunConfig, texts: Iterator[str]) -> bytes:
    """Train a SentencePiece Unigram model (T5 layout: pad 0, eos 1, unk 2, no bos); returns the model proto."""
    import sentencepiece as spm

    tc = cfg.tokenizer
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=_paragraphs(texts, max_bytes=4000),
        model_writer=buf,
        model_type="unigram",
        vocab_size=tc.vocab_size - NUM_SENTINELS,
        character_coverage=tc.character_coverage,
        input_sentence_size=tc.input_sentence_size,
        shuffle_input_sentence=True,
        max_sentence_length=4192,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=max(1, cfg.shards.workers),
        minloglevel=2,
        # Small corpora cannot fill a large vocabulary; fail with SentencePiece's own message rather than guess.
        hard_vocab_limit=True,
        # Characters outside the vocabulary (rare letters, emoji, CJK) become UTF-8 byte pieces, not <unk>.
        byte_fallback=tc.byte_fallback,
    )
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------- saving
def make_portable(folder: Path, convention: str | None = None, **extra: Any) -> None:
    """Rewrite a saved tokenizer folder so transformers 4.40+ and 5.x both load it.

    - tokenizer_config.json: 5.x writes `tokenizer_class: TokenizersBackend` (unknown to 4.x) and a list under
      `extra_special_tokens` (4.x reads that key as a dict and fails); both versions read
      `additional_special_tokens` and resolve the class names of CONVENTIONS.
    - tokenizer.json: tokenizers >= 0.20 writes BPE merges as pairs, which tokenizers 0.19 (transformers 4.40)
      cannot parse; "a b" strings read in every version, and byte-level BPE tokens never contain a space.
    """
    folder = Path(folder)
    path = folder / "tokenizer_config.json"
    conf = json.loads(path.read_text())
    extra_tokens = conf.pop("extra_special_tokens", None)
    if isinstance(extra_tokens, list) and extra_tokens:
        conf["additional_special_tokens"] = extra_tokens
    conf.pop("backend", None)
    if convention is not None:
        conv = CONVENTIONS.get(convention)
        conf["tokenizer_class"] = conv.tokenizer_class
        conf["padding_side"] = conv.padding_side
    if conf.get("tokenizer_class") in (None, "TokenizersBackend"):
        conf["tokenizer_class"] = "PreTrainedTokenizerFast"  # tokenizer.json as written, in 4.x and 5.x
    conf.update(extra)
    path.write_text(json.dumps(conf, indent=2, ensure_ascii=False) + "\n")

    tj_path = folder / "tokenizer.json"
    tj = json.loads(tj_path.read_text())
    merges = tj.get("model", {}).get("merges")
    if merges and isinstance(merges[0], list) and not any(" " in a or " " in b for a, b in merges):
        tj["model"]["merges"] = [f"{a} {b}" for a, b in merges]
        tj_path.write_text(json.dumps(tj, indent=2, ensure_ascii=False))


def remove_staging(folder: Path) -> None:
    """Staging folders of an earlier save that was killed (`.<name>.<random>`, `<name>.tmp`): one tokenizer is
    trained at a time per run folder, so they are dead."""
    stale = [*folder.parent.glob(f".{folder.name}.*"), folder.with_name(folder.name + ".tmp")]
    for p in stale:
        if p.is_dir():
            log.info(f"[tokenizer] removing {p.name}, left by an interrupted save")
            shutil.rmtree(p, ignore_errors=True)


def save_tokenizer(tok: Tokenizer, convention: str, folder: Path, model_max_length: int,
                   extra_files: dict | None = None, lowercase: bool = False):  # fmt: skip
    """Write an HF tokenizer folder atomically (tmp folder, then rename): a crash never leaves half a folder."""
    from transformers import PreTrainedTokenizerFast

    conv = CONVENTIONS.get(convention)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_staging(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        names = list(conv.model_input_names)
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, model_input_names=names,
                                     padding_side=conv.padding_side, **conv.hf_tokens)  # fmt: skip
        hf.save_pretrained(str(tmp))
        # BertTokenizerFast (4.x) re-lowercases unless told: the normaliser we trained is the truth.
        make_portable(tmp, convention, **({"do_lower_case": lowercase} if conv.lowercase_flag else {}))
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        replace_dir(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return folder


def unk_rate(tok: Tokenizer, texts: Iterator[str], max_tokens: int = 100_000) -> tuple[float, int]:
    """Share of `<unk>` tokens when encoding texts (stops after the batch that reaches max_tokens tokens);
    (rate, tokens counted).

    A byte-level BPE has no `<unk>`: a byte missing from its vocabulary is dropped from the text silently. Its check
    is structural (every one of the 256 bytes in the vocabulary: rate 0 with 0 tokens encoded, else an error) and
    costs no encoding pass, which on a small corpus was a third of the training time."""
    if isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel):
        missing = set(pre_tokenizers.ByteLevel.alphabet()) - set(tok.get_vocab())
        if missing:
            raise ValueError(f"byte-level BPE vocabulary lacks {len(missing)} of the 256 bytes: text with them "
                             "would be dropped silently")  # fmt: skip
        return 0.0, 0
    unk_id = next((tok.token_to_id(t) for t in ("<unk>", "[UNK]") if tok.token_to_id(t) is not None), None)
    n = hits = 0
    # encode_batch_fast: ids only (no offsets); batches of 64 documents keep both cores busy and stop near max_tokens.
    for batch in _batched(texts, 64):
        for enc in tok.encode_batch_fast(batch, add_special_tokens=False):
            ids = enc.ids
            n += len(ids)
            if unk_id is not None:
                hits += ids.count(unk_id)
        if n >= max_tokens:
            break
    return (hits / n if n else 0.0), n


def load_tokenizer(path: str | os.PathLike[str]):
    """The saved folder as transformers sees it (what training, export and fine-tuning use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def train_tokenizer(cfg: RunConfig) -> Path:
    """Train cfg.tokenizer on the cleaned corpus (streamed) and save it under RunLayout.tokenizer; a remote run
    reads the corpus from, and uploads the folder to, run.output_dir (tokenizer.json last)."""
    from core.run_layout import RunLayout
    from data_pipeline.shards import pull_corpus

    layout = RunLayout(cfg)
    if cfg.tokenizer.pretrained_path is None:
        pull_corpus(cfg)
    out = _train_tokenizer(cfg, layout.tokenizer)
    layout.store.remove(out)  # no file of an older tokenizer may stay beside the new one
    layout.store.push([out])
    return out


def _train_tokenizer(cfg: RunConfig, out: Path) -> Path:
    tc = cfg.tokenizer
    model_max_length = (
        FAMILIES.get(cfg.model.family).position_limit(cfg.model.max_position_embeddings)
        or cfg.packing.seq_len
    )
    if tc.pretrained_path:
        from transformers import AutoTokenizer

        tmp = out.with_name(out.name + ".tmp")
        remove_staging(out)  # left by a killed earlier copy
        AutoTokenizer.from_pretrained(tc.pretrained_path).save_pretrained(str(tmp))
        make_portable(tmp)
        return replace_dir(tmp, out)
    verify_corpus(cfg, "train-tokenizer")
    require_texts(cfg)
    texts = iter_texts(cfg, limit=tc.max_train_docs)
    extra: dict[str, bytes] = {}
    if tc.type == "bpe":
        tok = _train_bpe(cfg, texts)
    elif tc.type == "wordpiece":
        tok = _train_wordpiece(cfg, texts)
    else:
        proto = train_spm_unigram(cfg, texts)
        tok = spm_to_tokenizer(proto)
        extra["spiece.model"] = proto
    if tok.get_vocab_size() < 8 + len(BPE_SPECIALS):
        raise ValueError(
            f"tokenizer trained on an empty corpus (vocab {tok.get_vocab_size()}): no cleaned text?"
        )
    rate, counted = unk_rate(tok, iter_texts(cfg, limit=tc.unk_sample_docs), max_tokens=tc.unk_sample_tokens)
    basis = "byte alphabet" if tc.type == "bpe" else "sample"  # our BPE is byte-level: see unk_rate
    where = ("(byte-level: all 256 bytes in the vocabulary)" if basis == "byte alphabet"
             else f"over a sample of {counted:,} tokens")  # fmt: skip
    log.info(
        f"[tokenizer] {tc.type}: <unk> rate {100 * rate:.4f}% {where} "
        f"(tokenizer.max_unk_rate {100 * tc.max_unk_rate:.4f}%)"
    )
    if rate > tc.max_unk_rate:
        hint = "set tokenizer.byte_fallback=true" if tc.type == "unigram" else "raise tokenizer.vocab_size"
        raise ValueError(
            f"tokenizer.max_unk_rate: {100 * rate:.3f}% of tokens are <unk> on a corpus sample "
            f"(limit {100 * tc.max_unk_rate:.3f}%); {hint} or raise the limit"
        )
    conv = convention_name(tc.type, cfg.model.family, tc.convention)
    extra["training_meta.json"] = json.dumps(
        {"type": tc.type, "convention": conv, "family": cfg.model.family, "vocab_size": tok.get_vocab_size(),
         "requested_vocab_size": tc.vocab_size, "lowercase": tc.lowercase,
         "byte_fallback": tc.byte_fallback if tc.type == "unigram" else None,
         "unk_rate": rate, "unk_rate_tokens": counted, "unk_rate_basis": basis}, indent=2).encode()  # fmt: skip
    return save_tokenizer(tok, conv, out, model_max_length, extra, lowercase=tc.lowercase)
