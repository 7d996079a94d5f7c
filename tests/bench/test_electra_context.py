"""bench/electra_context.py: the token-identity bound it compares the discriminator against is the BCE of the best
classifier that sees each token alone, checked against a simulation of the corruption it models."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import electra_context as ec  # noqa: E402


def test_identity_bound_matches_the_simulated_best_per_token_classifier():
    rng = np.random.default_rng(0)
    special, candidates = {0}, list(range(1, 21))
    # a Zipf-like stream over 20 tokens with some special tokens in it (never replaced)
    weights = 1.0 / np.arange(1, 21)
    stream = rng.choice(np.arange(1, 21), size=20_000, p=weights / weights.sum())
    stream[::50] = 0
    bound = ec.identity_bound(Counter(stream.tolist()), candidates, special)

    # Simulate the corruption many times; the best token-identity classifier predicts, for each shown token, the
    # fraction of its showings that were replacements; its BCE is the conditional entropy of the simulation.
    shown, replaced = [], []
    for _ in range(40):
        sel = (rng.random(stream.shape) < ec.MASK_RATE) & (stream != 0)
        draw = rng.choice(candidates, size=stream.shape)
        corrupted = np.where(sel, draw, stream)
        shown.append(corrupted)
        replaced.append(corrupted != stream)
    shown, replaced = np.concatenate(shown), np.concatenate(replaced)
    h = 0.0
    for w in np.unique(shown):
        y = replaced[shown == w]
        p = y.mean()
        if 0 < p < 1:
            h -= len(y) * (p * math.log(p) + (1 - p) * math.log(1 - p))
    simulated = h / len(shown)
    assert abs(bound - simulated) < 0.01 * simulated
    # and it is below the prior: token identity alone tells something
    q = replaced.mean()
    assert bound < -(q * math.log(q) + (1 - q) * math.log(1 - q)) - 0.01
