"""Training metrics: TensorBoard + JSONL on rank 0, throughput, MFU, loader wait, memory."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from core.layout import METRICS
from core.specs import training_flops_per_token
from runconfig.model import ModelConfig


def flops_per_token(
    m: ModelConfig, n_params: int, seq_len: int, input_embedding: int = 0, rerun: tuple[int, float] = (0, 0.0)
) -> float:
    """Training FLOPs per token, as the family's spec counts them (default: 6N + attention, PaLM appendix B).

    N counts matmul weights: `input_embedding` (from `untied_input_embedding`) is taken off, since the input
    embedding of an untied model (Llama) is a lookup, not a matmul; a tied one is also the LM head and stays.
    `rerun`: what the objective runs twice (`objective_rerun`)."""
    return training_flops_per_token(m.spec, m, n_params - input_embedding, seq_len, rerun)


def objective_rerun(cfg: Any, module: torch.nn.Module) -> tuple[int, float]:
    """What the run's objective runs twice (`ObjectiveSpec.rerun`), or nothing."""
    rerun = cfg.objective.spec.rerun
    return (0, 0.0) if rerun is None else rerun(cfg, module)


def untied_input_embedding(model: torch.nn.Module) -> int:
    """Parameters of the input embedding when it is not also the output head (untied), else 0."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    emb = get_in() if get_in is not None else None
    head = get_out() if get_out is not None else None
    if emb is None or getattr(emb, "weight", None) is None:
        return 0
    if head is not None and getattr(head, "weight", None) is emb.weight:
        return 0
    return emb.weight.numel()


def measure_peak_flops(
    n: int | None = None, repeats: int = 10, trials: int = 3, device: str = "cpu"
) -> float:
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


class Sink:
    """One destination of metric rows (TensorBoard, JSONL, W&B, MLflow): log(step, values, prefix), close()."""

    def log(self, step: int, values: dict[str, Any], prefix: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardSink(Sink):
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(folder))

    def log(self, step, values, prefix):
        for k, v in values.items():
            if isinstance(v, int | float):
                self.tb.add_scalar(f"{prefix}/{k}", v, step)

    def close(self):
        self.tb.close()


class JsonlSink(Sink):
    """metrics.jsonl: one row per log call, with the wall-clock time (unix seconds and ISO 8601 UTC)."""

    def __init__(self, folder: Path):
        self.f = open(folder / METRICS, "a")  # noqa: SIM115 - lives as long as the logger

    def log(self, step, values, prefix):
        now = time.time()
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        self.f.write(
            json.dumps({"step": step, "split": prefix, "time": round(now, 3), "timestamp": iso, **values})
            + "\n"
        )
        self.f.flush()

    def close(self):
        self.f.close()


class WandbSink(Sink):
    def __init__(self, cfg, folder: Path):
        try:
            import wandb
        except ImportError:
            raise RuntimeError("logging.wandb.enabled needs wandb: pip install 'lmstack[wandb]'") from None
        wc = cfg.logging.wandb
        self.run = wandb.init(
            project=wc.project,
            entity=wc.entity,
            name=wc.name or cfg.run.name,
            mode=wc.mode,
            dir=str(wc.dir or folder),
            config=json.loads(cfg.model_dump_json()),
            # the string setting; the boolean form is deprecated
            reinit=wc.reinit,
        )

    def log(self, step, values, prefix):
        self.run.log({f"{prefix}/{k}": v for k, v in values.items() if isinstance(v, int | float)}, step=step)

    def close(self):
        self.run.finish()


MLFLOW_BATCH = 100  # MLflow accepts at most 100 params per log_params / log_batch call
MLFLOW_VALUE_CHARS = 6000  # and values of at most 6000 characters (MLflow >= 2; 500 before)


def flat_params(cfg) -> dict[str, str]:
    """Every key of the resolved config, flattened to dotted names (lists and dicts inside lists as JSON)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[prefix] = text[:MLFLOW_VALUE_CHARS]

    walk("", json.loads(cfg.model_dump_json()))
    return out


def param_batches(flat: dict[str, str], size: int = MLFLOW_BATCH) -> list[dict[str, str]]:
    items = list(flat.items())
    return [dict(items[i : i + size]) for i in range(0, len(items), size)]


class MlflowSink(Sink):
    def __init__(self, cfg, folder: Path):
        try:
            import mlflow
        except ImportError:
            raise RuntimeError("logging.mlflow.enabled needs mlflow: pip install 'lmstack[mlflow]'") from None
        mc = cfg.logging.mlflow
        self.mlflow = mlflow
        if mc.tracking_uri is None:
            # The default keeps runs beside the others in the run folder, with no server or database needed;
            # MLflow 3 asks for this opt-in to its (maintained but frozen) file store.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(mc.tracking_uri or (folder / "mlruns").resolve().as_uri())
        mlflow.set_experiment(mc.experiment)
        self.run = mlflow.start_run(run_name=mc.run_name or cfg.run.name)
        # The whole resolved config: as an artifact (what reruns it) and as params, in batches MLflow accepts.
        mlflow.log_text(
            yaml.safe_dump(json.loads(cfg.model_dump_json()), sort_keys=False), "resolved_config.yaml"
        )
        for batch in param_batches(flat_params(cfg)):
            mlflow.log_params(batch)

    def log(self, step, values, prefix):
        self.mlflow.log_metrics(
            {f"{prefix}/{k}": float(v) for k, v in values.items() if isinstance(v, int | float)}, step=step
        )

    def close(self):
        self.mlflow.end_run()


# Optional sinks by name: each is switched on by `logging.<name>.enabled` (extension by registration).
OPTIONAL_SINKS: dict[str, Any] = {"wandb": WandbSink, "mlflow": MlflowSink}


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
        row = torch.stack(
            [
                *(v.detach().double().reshape(()) for v in values.values()),
                torch.ones((), dtype=torch.float64, device=next(iter(values.values())).device),
            ]
        )
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

    def __init__(self, folder: Path, enabled: bool, tensorboard: bool = True, jsonl: bool = True, cfg=None):
        self.enabled = enabled
        self.sinks: list[Sink] = []
        if not enabled:
            return
        folder.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            self.sinks.append(TensorBoardSink(folder))
        if jsonl:
            self.sinks.append(JsonlSink(folder))
        if cfg is not None:
            for name, factory in OPTIONAL_SINKS.items():
                if getattr(cfg.logging, name).enabled:
                    self.sinks.append(factory(cfg, folder))

    @classmethod
    def from_config(cls, cfg, folder: Path, enabled: bool) -> MetricsLogger:
        return cls(folder, enabled, cfg.logging.tensorboard, cfg.logging.jsonl, cfg)

    def log(self, step: int, values: dict[str, Any], prefix: str = "train") -> None:
        if not self.enabled:
            return
        for sink in self.sinks:
            sink.log(step, values, prefix)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class Throughput:
    """Accumulates time and tokens between log points; reports rates, MFU and the loader-wait fraction.

    MFU (`mfu`) only against a stated peak (`logging.peak_flops`, a published figure a reader can compare).
    Against the matmul probe of this host it is `probe_util`: model FLOP/s over what one dense matmul reached
    here, which on a CPU reads 30-60% and is no MFU (issue 43)."""

    def __init__(
        self, flops_per_token: float, peak_flops_per_rank: float, world_size: int, stated_peak: bool = True
    ):
        self.fpt, self.peak, self.world = flops_per_token, peak_flops_per_rank, world_size
        self.key = "mfu" if stated_peak else "probe_util"
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
            self.key: tps * self.fpt / (self.peak * self.world) if self.peak else 0.0,
            "loader_wait_frac": self.wait / dt,
            "memory_mb": memory_mb(),
        }
        self.reset()
        return out
