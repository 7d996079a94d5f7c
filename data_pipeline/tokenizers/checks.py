"""Checks of a trained tokenizer against its corpus (the `<unk>` rate that `tokenizer.max_unk_rate` bounds)."""

from __future__ import annotations

from collections.abc import Iterator

from tokenizers import (
    Tokenizer,
    pre_tokenizers,
)

from data_pipeline.tokenizers.corpus import batched

# The sample the `<unk>` rate is measured on: the first UNK_SAMPLE_DOCS documents, encoding stopped once
# UNK_SAMPLE_TOKENS tokens are counted. 100k tokens put ~100 <unk> at the default 0.1% limit: enough for a guard,
# and on a small corpus the pass no longer costs a fifth of the training time. Internal defaults since issue 65
# (they were `tokenizer.unk_sample_docs` / `unk_sample_tokens`, tuning knobs no user needed).
UNK_SAMPLE_DOCS = 500
UNK_SAMPLE_TOKENS = 100_000


def unk_rate(tok: Tokenizer, texts: Iterator[str], max_tokens: int = UNK_SAMPLE_TOKENS) -> tuple[float, int]:
    """Share of `<unk>` tokens when encoding texts (stops after the batch that reaches max_tokens tokens);
    (rate, tokens counted).

    A byte-level BPE has no `<unk>`: a byte missing from its vocabulary is dropped from the text silently. Its check
    is structural (every one of the 256 bytes in the vocabulary: rate 0 with 0 tokens encoded, else an error) and
    costs no encoding pass, which on a small corpus was a third of the training time."""
    if isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel):
        missing = set(pre_tokenizers.ByteLevel.alphabet()) - set(tok.get_vocab())
        if missing:
            raise ValueError(
                f"byte-level BPE vocabulary lacks {len(missing)} of the 256 bytes: text with them "
                "would be dropped silently"
            )
        return 0.0, 0
    unk_id = next((tok.token_to_id(t) for t in ("<unk>", "[UNK]") if tok.token_to_id(t) is not None), None)
    n = hits = 0
    # encode_batch_fast: ids only (no offsets); batches of 64 documents keep both cores busy and stop near max_tokens.
    for batch in batched(texts, 64):
        for enc in tok.encode_batch_fast(batch, add_special_tokens=False):
            ids = enc.ids
            n += len(ids)
            if unk_id is not None:
                hits += ids.count(unk_id)
        if n >= max_tokens:
            break
    return (hits / n if n else 0.0), n
