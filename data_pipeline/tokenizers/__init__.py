"""Train the run's tokenizer from the cleaned corpus and save it as a folder `AutoTokenizer` loads.

Three families, each with the special tokens and post-processing its model expects (contract 2):
- bpe: byte-level BPE (GPT-2/RoBERTa), `<s> <pad> </s> <unk> <mask>` = ids 0..4; RoBERTa adds `<s> A </s></s> B </s>`,
  GPT-2 adds nothing (EOS goes between documents at packing time).
- wordpiece: BERT, `[PAD] [UNK] [CLS] [SEP] [MASK]` = ids 0..4, `[CLS] A [SEP] B [SEP]`, optional lower-casing.
- unigram: SentencePiece Unigram (T5), `<pad>`=0 `</s>`=1 `<unk>`=2, `<extra_id_0..99>` as the last 100 ids, `A </s>`.

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

from data_pipeline.tokenizers.corpus import iter_texts, require_texts
from runconfig import RunConfig

BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]
NUM_SENTINELS = 100


def _batched(texts: Iterator[str], n: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _family(cfg: RunConfig):
    """The model family's spec: how sequences are wrapped and how long they may be (torch-free)."""
    from pretrain.families import get_family

    return get_family(cfg.model.family)


# ---------------------------------------------------------------------------------------------------- BPE
def bpe_tokenizer(vocab: dict[str, int] | None = None, merges: list[tuple[str, str]] | None = None) -> Tokenizer:
    """The byte-level BPE encoding path (GPT-2's regex pre-split + byte alphabet); empty or from vocab+merges."""
    model = models.BPE(vocab, merges) if vocab is not None else models.BPE()
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _bpe_post(tok: Tokenizer, wraps_sequences: bool) -> None:
    if wraps_sequences:  # RoBERTa-style families: `<s> A </s>`, `<s> A </s></s> B </s>`
        tok.post_processor = processors.RobertaProcessing(
            ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")), trim_offsets=True, add_prefix_space=False
        )
    else:  # GPT-2 adds no special tokens; offsets still trimmed of the leading space.
        tok.post_processor = processors.ByteLevel(trim_offsets=True)


def _train_bpe(cfg: RunConfig, texts: Iterator[str]) -> Tokenizer:
    tc = cfg.tokenizer
    tok = bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=tc.vocab_size,
        min_frequency=tc.min_frequency,
        special_tokens=BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_batched(texts), trainer=trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    _bpe_post(tok, _family(cfg).wraps_sequences)
    return tok


# ---------------------------------------------------------------------------------------------------- WordPiece
def _train_wordpiece(cfg: RunConfig, texts: Iterator[str]) -> Tokenizer:
    tc = cfg.tokenizer
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=tc.lowercase)
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
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


# ---------------------------------------------------------------------------------------------------- Unigram
def _paragraphs(texts: Iterator[str], max_bytes: int) -> Iterator[str]:
    """SentencePiece trains on lines; paragraphs keep context, and over-long ones are cut (it would skip them)."""
    for text in texts:
        for para in text.split("\n"):
            para = para.strip()
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
    tok = Tokenizer(models.Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    seq = [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), "▁")]
    charsmap = proto.normalizer_spec.precompiled_charsmap
    tok.normalizer = normalizers.Sequence(([normalizers.Precompiled(charsmap)] if charsmap else []) + seq)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
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
    )
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------- saving
def special_tokens_for(kind: str) -> dict[str, Any]:
    """The HF special-token kwargs for a tokenizer family."""
    if kind == "bpe":
        return dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                    pad_token="<pad>", mask_token=AddedToken("<mask>", lstrip=True, special=True))  # fmt: skip
    if kind == "wordpiece":
        return dict(cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")
    return dict(eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                additional_special_tokens=[f"<extra_id_{i}>" for i in range(NUM_SENTINELS)])  # fmt: skip


def save_tokenizer(tok: Tokenizer, kind: str, folder: Path, model_max_length: int, extra_files: dict | None = None):
    """Write an HF tokenizer folder atomically (tmp folder, then rename): a crash never leaves half a folder."""
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        names = ["input_ids", "token_type_ids", "attention_mask"] if kind == "wordpiece" else ["input_ids", "attention_mask"]
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, model_input_names=names,
                                     **special_tokens_for(kind))  # fmt: skip
        hf.save_pretrained(str(tmp))
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        old = folder.with_name(folder.name + ".old")
        if folder.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(folder, old)
        os.replace(tmp, folder)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return folder


def load_tokenizer(path: str | os.PathLike[str]):
    """The saved folder as transformers sees it (what training, export and fine-tuning use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def train_tokenizer(cfg: RunConfig) -> Path:
    """Train cfg.tokenizer on the cleaned corpus (streamed) and save it under RunLayout.tokenizer."""
    from data_pipeline.layout import RunLayout

    out = RunLayout(cfg).tokenizer
    tc = cfg.tokenizer
    model_max_length = _family(cfg).position_limit(cfg.model.max_position_embeddings) or cfg.packing.seq_len
    if tc.pretrained_path:
        from transformers import AutoTokenizer

        tmp = out.with_name(out.name + ".tmp")
        AutoTokenizer.from_pretrained(tc.pretrained_path).save_pretrained(str(tmp))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        return out
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
        raise ValueError(f"tokenizer trained on an empty corpus (vocab {tok.get_vocab_size()}): no cleaned text?")
    extra["training_meta.json"] = json.dumps(
        {"type": tc.type, "family": cfg.model.family, "vocab_size": tok.get_vocab_size(),
         "requested_vocab_size": tc.vocab_size, "lowercase": tc.lowercase}, indent=2).encode()  # fmt: skip
    return save_tokenizer(tok, tc.type, out, model_max_length, extra)


