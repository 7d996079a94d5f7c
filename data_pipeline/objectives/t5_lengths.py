"""T5's `random_spans_helper`: raw block length whose span-corrupted input fills the encoder exactly.

Shared by packing (how many raw tokens per block) and the span-corruption collator (target length).
Port of t5.data.preprocessors.random_spans_helper (Raffel et al. 2020).
"""

from __future__ import annotations


def _corrupted_lengths(
    tokens_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    num_noise_tokens = int(round(tokens_length * noise_density))
    num_nonnoise_tokens = tokens_length - num_noise_tokens
    num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
    # inputs: non-noise tokens + one sentinel per span + EOS; targets: noise tokens + one sentinel per span + EOS
    return num_nonnoise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1


def t5_lengths(
    inputs_length: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0
) -> tuple[int, int]:
    """Return (raw tokens per block, targets length) so that corrupted inputs are exactly `inputs_length`."""
    tokens_length = inputs_length
    while _corrupted_lengths(tokens_length + 1, noise_density, mean_noise_span_length)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = _corrupted_lengths(tokens_length, noise_density, mean_noise_span_length)
    # T5 special case: with noise_density 0.5, targets can be one longer than inputs; keep the reference behaviour.
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length
