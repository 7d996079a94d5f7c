"""A Hugging Face folder made by transformers alone (no lmstack file in it): a tiny random GPT-2 with a byte-level
BPE tokenizer trained here on a few sentences (the `tokenizers` library), both saved with `save_pretrained`.
Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

TEXTS = [
    "Markets rallied as shares in technology firms rose for a third day.",
    "The team won the final after a late goal in extra time.",
    "Ministers announced a new budget for schools and hospitals.",
    "The film festival opened with a premiere attended by the director.",
] * 20


def tokenizer_of(vocab_size: int = 400):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
    return GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def gpt2_folder(
    out: Path,
    vocab_size: int = 400,
    positions: int = 64,
    tokenizer: bool = True,
    weights: bool = True,
    head: str = "GPT2LMHeadModel",
) -> Path:
    """`out` holding a random tiny GPT-2 (`head` class) and, if asked, its tokenizer: transformers' files only."""
    import torch
    import transformers
    from transformers import GPT2Config

    tok = tokenizer_of(vocab_size)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=positions,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = getattr(transformers, head)(config)
    if weights:
        model.save_pretrained(out)
    else:
        config.architectures = [head]
        config.save_pretrained(out)
    if tokenizer:
        tok.save_pretrained(out)
    return out
