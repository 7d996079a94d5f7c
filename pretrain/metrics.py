"""Training metrics: TensorBoard + JSONL on rank 0, throughput, MFU, loader wait, memory."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch

from pretrain.families import get_family
from runconfig.model import ModelConfig


def flops_per_token(m: ModelConfig, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token, as the family's spec counts them (default: 6N + attention, PaLM appendix B)."""
    spec = get_family(m.family)
    return spec.flops_per_token(spec, m, n_params, seq_len)


def measure_peak_flops(n: int | None = None, repeats: int = 10, trials: int = 3, device: str = "cpu") -> float:
    """Dense matmul FLOP/s this process achieves: the denominator of MFU when the user gives no peak.

    Best of several trials, so a momentarily busy machine does not read low and inflate MFU; on a GPU the
    matrices are large enough (8192) to reach the tensor-core peak. Setting `logging.peak_flops` (e.g. a GPU's
    published dense bf16 peak) skips the measurement."""
    n = n or (1024 if device == "cpu" else 8192)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = 0.0
    for _ in range(trials):
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - t0))
    return best


def memory_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class OutputMetrics:
    """Figures a model output carries in a `metrics` dict (an objective's own: ELECTRA's generator and
    discriminator losses, replaced fraction, discriminator accuracy): summed on the device per micro-batch (no host
    sync), averaged over the step's micro-batches and ranks like its loss, with one all-reduce at logging steps
    only (every rank logs at the same steps)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.total: torch.Tensor | None = None

    def add(self, output: Any) -> None:
        values = getattr(output, "metrics", None)
        if not values:
            return
        row = torch.stack([*(v.detach().double().reshape(()) for v in values.values()),
                           torch.ones((), dtype=torch.float64, device=next(iter(values.values())).device)])
        if self.total is None:
            self.names, self.total = list(values), torch.zeros_like(row)
        self.total += row

    def new_step(self) -> None:
        if self.total is not None:
            self.total.zero_()

    def report(self) -> dict[str, float]:
        if self.total is None:
            return {}
        import torch.distributed as dist

        if dist.is_initialized():
            dist.all_reduce(self.total)
        *sums, n = self.total.tolist()
        self.total.zero_()
        return {k: v / max(n, 1.0) for k, v in zip(self.names, sums, strict=True)}


class MetricsLogger:
    """Rank 0 writes; other ranks hold a disabled logger so call sites need no rank checks."""

    def __init__(self, folder: Path, enabled: bool, tensorboard: bool = True, jsonl: bool = True):
        self.enabled = enabled
        self.tb = None
        self.jsonl = None
        if not enabled:
            return
        folder.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(folder))
        if jsonl:
            self.jsonl = open(folder / "metrics.jsonl", "a")

    def log(self, step: int, values: dict[str, Any], prefix: str = "train") -> None:
        if not self.enabled:
            return
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, int | float):
                    self.tb.add_scalar(f"{prefix}/{k}", v, step)
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({"step": step, "split": prefix, **values}) + "\n")
            self.jsonl.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.jsonl is not None:
            self.jsonl.close()


class Throughput:
    """Accumulates time and tokens between log points; reports rates, MFU and the loader-wait fraction."""

    def __init__(self, flops_per_token: float, peak_flops_per_rank: float, world_size: int):
        self.fpt, self.peak, self.world = flops_per_token, peak_flops_per_rank, world_size
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.samples = 0
        self.wait = 0.0

    def add(self, tokens: int, samples: int, wait_s: float) -> None:
        self.tokens += tokens
        self.samples += samples
        self.wait += wait_s

    def new_step(self) -> None:
        if self.total is not None:
            self.total.zero_()

    def report(self) -> dict[str, float]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        tps = self.tokens / dt
        out = {
            "tokens_per_s": tps,
            "samples_per_s": self.samples / dt,
            "mfu": tps * self.fpt / (self.peak * self.world) if self.peak else 0.0,
            "loader_wait_frac": self.wait / dt,
            "memory_mb": memory_mb(),
        }
        self.reset()
        return out
