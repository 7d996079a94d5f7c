"""Sentence pairs as the saved tokenizer frames them: `tokenizer(a, b)` is the one encoding of a pair, for training
and for whoever loads a saved folder, so the two can never differ.

GPT-2's and Llama's byte-level tokenizers (the `gpt2` convention) add no special tokens, so `tokenizer(a, b)` gives
`a b` and a model cannot tell where the first text ends. `frame_pairs` gives such a tokenizer a pair template with
its separator (sep token, else end-of-text) between the texts - `a <|endoftext|> b` - in its post-processor, which
tokenizer.json saves and transformers 4.40+ and 5.x apply on load; single texts are encoded exactly as before.
"""

from __future__ import annotations

from typing import Any

from tokenizers import processors

from core.log import get_logger

log = get_logger(__name__)

_PROBE_A, _PROBE_B = "hello world", "good morning"


def _find(ids: list[int], piece: list[int], start: int = 0) -> int:
    for i in range(start, len(ids) - len(piece) + 1):
        if ids[i : i + len(piece)] == piece:
            return i
    return -1


def pair_frame(tok: Any) -> tuple[list[int], list[int], list[int]] | None:
    """The special tokens `tok(a, b)` puts before, between and after the two texts ([CLS] a [SEP] b [SEP]:
    ([CLS], [SEP], [SEP])), found by encoding a probe pair with and without them; None if the texts are not
    found whole inside the framed pair (a tokenizer that merges across the boundary)."""
    a = tok(_PROBE_A, add_special_tokens=False)["input_ids"]
    b = tok(_PROBE_B, add_special_tokens=False)["input_ids"]
    full = tok(_PROBE_A, _PROBE_B, add_special_tokens=True)["input_ids"]
    i = _find(full, a)
    j = _find(full, b, i + len(a)) if i >= 0 else -1
    if j < 0:
        return None
    return full[:i], full[i + len(a) : j], full[j + len(b) :]


def _single_frame(tok: Any) -> tuple[list[int], list[int]] | None:
    """The special tokens `tok(a)` puts before and after one text (none for GPT-2's)."""
    plain = tok(_PROBE_A, add_special_tokens=False)["input_ids"]
    full = tok(_PROBE_A)["input_ids"]
    i = _find(full, plain)
    return None if i < 0 else (full[:i], full[i + len(plain) :])


def frame_pairs(tok: Any) -> bool:
    """Make `tok(a, b)` put a separator between the two texts where its post-processor puts nothing (the `gpt2`
    convention's `a b`): a TemplateProcessing pair `$A <sep> $B` after the byte-level offset trimming. Returns
    whether pairs are now framed with something between the texts (False: a slow tokenizer, or no sep or eos token
    to put there); a tokenizer that already frames pairs (BERT's, RoBERTa's, T5's) is left as it is."""
    frame = pair_frame(tok)
    if frame is not None and frame[1]:
        return True
    sep = tok.sep_token if tok.sep_token is not None else tok.eos_token
    backend = getattr(tok, "backend_tokenizer", None)
    if sep is None or backend is None or frame is None:
        return False
    one = _single_frame(tok)
    if one is None:
        return False
    names = tok.convert_ids_to_tokens
    prefix, _, suffix = frame
    single = [*names(one[0]), "$A", *names(one[1])]
    pair = [*names(prefix), "$A", sep, "$B:1", *(f"{t}:1" for t in names(suffix))]
    used = {*names(one[0]), *names(one[1]), *names(prefix), sep, *names(suffix)}
    template = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, tok.convert_tokens_to_ids(t)) for t in sorted(used)]
    )
    current = backend.post_processor
    # byte-level: keep the offset trimming; it adds no tokens, so the template is the whole frame
    keep = [current] if isinstance(current, processors.ByteLevel) else []
    backend.post_processor = processors.Sequence([*keep, template]) if keep else template
    log.info(f"[tokenizer] pairs framed as `a {sep} b` (the tokenizer put nothing between the two texts)")
    framed = pair_frame(tok)
    return framed is not None and bool(framed[1])
