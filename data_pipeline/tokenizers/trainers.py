"""Training a tokenizer of each type (byte-level BPE, WordPiece, SentencePiece Unigram) from the cleaned corpus,
then saving and checking it (`train_tokenizer`)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

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
from data_pipeline.tokenizers.checks import UNK_SAMPLE_DOCS, UNK_SAMPLE_TOKENS, unk_rate
from data_pipeline.tokenizers.conventions import (
    BPE_SPECIALS,
    CONVENTIONS,
    NUM_SENTINELS,
    T5_SPECIALS,
    WORDPIECE_SPECIALS,
    Convention,
    convention_name,
)
from data_pipeline.tokenizers.corpus import batched, iter_texts, require_texts, verify_corpus
from data_pipeline.tokenizers.saving import make_portable, remove_staging, save_tokenizer
from runconfig import RunConfig

log = get_logger(__name__)


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
    tok.train_from_iterator(batched(texts), trainer=trainer)
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
    tok.train_from_iterator(batched(texts), trainer=trainer)
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
    model_max_length = cfg.model.position_limit or cfg.packing.seq_len
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
    rate, counted = unk_rate(tok, iter_texts(cfg, limit=UNK_SAMPLE_DOCS), max_tokens=UNK_SAMPLE_TOKENS)
    basis = "byte alphabet" if tc.type == "bpe" else "sample"  # our BPE is byte-level: see unk_rate
    where = (
        "(byte-level: all 256 bytes in the vocabulary)"
        if basis == "byte alphabet"
        else f"over a sample of {counted:,} tokens"
    )
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
        {
            "type": tc.type,
            "convention": conv,
            "family": cfg.model.family,
            "vocab_size": tok.get_vocab_size(),
            "requested_vocab_size": tc.vocab_size,
            "lowercase": tc.lowercase,
            "byte_fallback": tc.byte_fallback if tc.type == "unigram" else None,
            "unk_rate": rate,
            "unk_rate_tokens": counted,
            "unk_rate_basis": basis,
        },
        indent=2,
    ).encode()
    return save_tokenizer(tok, conv, out, model_max_length, extra, lowercase=tc.lowercase)
