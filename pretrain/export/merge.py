"""Checkpoint merging: the mean of the weights of the last K complete checkpoints, exported as one model
(`python -m pretrain export --merge-last K`).

Averaging the checkpoints of a run's last stretch gives most of a learning-rate cool-down's gain without one
(Sanyal et al. 2023, "Early Weight Averaging"; OLMo-core's model merger callback). The mean is taken over each
checkpoint's consolidated fp32 weights, read from the saved files as the export reads them (zero_to_fp32 for
ZeRO 1-3), so it is the same whatever the ZeRO stage and world size that wrote them; it is accumulated in fp64
and cast back, so it equals a hand average of the same tensors to fp32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from core.errors import ConfigError


def tags_to_merge(complete: list[str], last: str, k: int, ckpt_dir: Path) -> list[str]:
    """The K complete tags ending at `last`, oldest first; fewer than K is refused, naming what was kept."""
    if k < 2:
        raise ConfigError(f"--merge-last {k}: merging needs 2 checkpoints or more")
    upto = sorted(t for t in complete if t <= last)
    if len(upto) < k:
        raise ConfigError(
            f"--merge-last {k}: {ckpt_dir} holds {len(upto)} complete checkpoint(s) up to {last} "
            f"({', '.join(upto) or 'none'}); keep more with checkpoint.keep_last"
        )
    return upto[-k:]


def merged_state_dict(
    tags: list[str], load: Callable[[str], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The mean of `load(tag)` over `tags` (fp64 sums, fp32 out). Every checkpoint must hold the same tensors."""
    sums: dict[str, torch.Tensor] = {}
    for i, tag in enumerate(tags):
        sd = load(tag)
        if i and set(sd) != set(sums):
            odd = sorted(set(sd) ^ set(sums))[:5]
            raise ConfigError(f"--merge-last: {tag} does not hold the same tensors as {tags[0]} ({odd})")
        for name, t in sd.items():
            if i == 0:
                sums[name] = t.detach().to(torch.float64).clone()
            elif sums[name].shape != t.shape:
                raise ConfigError(
                    f"--merge-last: {name} is {tuple(t.shape)} in {tag}, {tuple(sums[name].shape)} before"
                )
            else:
                sums[name] += t.detach().to(torch.float64)
    return {name: (s / len(tags)).to(torch.float32) for name, s in sums.items()}
