"""Held-out loss at every eval, mixed and per data source: the mixed figure alone hides a source the model stops
learning (or one it overfits) behind the others.

Each source is read on its own (`PretrainLoader.iter_source`): at most `eval.max_batches` micro-batches per rank
for EACH source, so an eval costs sources x max_batches forwards per rank. The loss of a micro-batch is the
objective's mean; a source's figure is the mean over its micro-batches weighted by their samples (a short last batch
counts for what it holds), and the mixed figure the same over every source's batches. One all-reduce per eval.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from data_pipeline.loader import PretrainLoader


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0)) if math.isfinite(loss) else float("nan")


def eval_figures(sums: list[list[float]], names: list[str]) -> dict[str, float]:
    """[weighted loss sum, samples] per source -> the eval row: loss/perplexity mixed, loss/<source> and
    perplexity/<source> for each source with held-out samples."""
    out: dict[str, float] = {}
    total = [sum(col) for col in zip(*sums, strict=True)] if sums else [0.0, 0.0]
    loss = total[0] / total[1] if total[1] > 0 else float("nan")
    out["loss"], out["perplexity"] = loss, perplexity(loss)
    for name, (s, n) in zip(names, sums, strict=True):
        if n > 0:
            out[f"loss/{name}"] = s / n
            out[f"perplexity/{name}"] = perplexity(s / n)
    return out


@torch.no_grad()
def evaluate(engine, loader: PretrainLoader, max_batches: int, device: torch.device) -> dict[str, float]:
    """The eval row (every rank runs the forwards; ZeRO-3 needs them all): see `eval_figures`."""
    engine.eval()
    names = list(loader.source_names)
    sums = torch.zeros(len(names), 2, device=device, dtype=torch.float64)
    for s, name in enumerate(names):
        for weight, batch in loader.iter_source(name, max_batches):
            out = engine(**{k: v.to(device, non_blocking=True) for k, v in batch.items()})
            if weight:  # 0: a stand-in forward that keeps this rank's collectives matched
                sums[s, 0] += out.loss.detach().double() * weight
                sums[s, 1] += weight
    dist.all_reduce(sums)
    engine.train()
    return eval_figures(sums.tolist(), names)
