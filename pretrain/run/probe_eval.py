"""The transfer probe in the loop (`eval.probe_task`): a logistic regression on the frozen body's mean-pooled last
hidden states, fitted on a fine-tune task's train examples and scored on its dev examples, at every eval.

Held-out loss does not say whether a body will transfer (docs/results.md: T5 and ELECTRA runs with falling loss
exported bodies that fine-tuned below random init); this figure, beside the same probe on the random-init weights
(measured once, before the first step, and carried in the checkpoints), does. It runs on rank 0 alone, on the
engine's own module at ZeRO 0-2 (rank 0 holds the whole weights; ZeRO-3 is refused at load), without gradients and
without touching the global RNG, in bounded time (`PROBE_MAX_EXAMPLES` per split, `eval.probe_max_seconds`); the other
ranks wait. The test split of the task is never read. adapt/probes.py fits its probe with the same classifier.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from core.log import get_logger
from runconfig import RunConfig

log = get_logger(__name__)

STATE_KEY = "probe_random_init"  # the random-init figure in a checkpoint's client state


def fit_linear_probe(x: np.ndarray, y: np.ndarray):
    """Standardised features -> logistic regression (lbfgs, deterministic): the classifier of every frozen probe."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0)).fit(x, y)


def feature_body(module: torch.nn.Module) -> torch.nn.Module:
    """The body whose last hidden states are the features: an RTD module's discriminator body, the encoder of an
    encoder-decoder, else the HF model's base model (GPT2Model of GPT2LMHeadModel, ...)."""
    disc = getattr(module, "discriminator", None)
    if disc is not None:
        module = getattr(disc, "body", disc)
    if getattr(getattr(module, "config", None), "is_encoder_decoder", False):
        return module.get_encoder()
    return getattr(module, "base_model", module)


@dataclass
class ProbeSplit:
    ids: list[list[int]]  # token ids per example, truncated to the probe's length
    labels: np.ndarray


@torch.no_grad()
def pooled_features(
    body: torch.nn.Module, split: ProbeSplit, pad_id: int, length: int, batch_size: int, deadline: float
) -> np.ndarray:
    """Mean-pooled last hidden state per example, in batches padded to one `length` (a compiled body sees one
    shape); stops at `deadline` (perf_counter) and returns the examples encoded by then."""
    device = next(body.parameters()).device
    kwargs = {"use_cache": False} if getattr(getattr(body, "config", None), "use_cache", False) else {}
    feats = []
    for s in range(0, len(split.ids), batch_size):
        if time.perf_counter() > deadline:
            break
        chunk = split.ids[s : s + batch_size]
        ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), length), dtype=torch.long)
        for i, row in enumerate(chunk):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        ids, mask = ids.to(device), mask.to(device)
        out = body(input_ids=ids, attention_mask=mask, **kwargs)
        h = (out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]).float()
        m = mask.unsqueeze(-1).to(h.dtype)
        feats.append(((h * m).sum(1) / m.sum(1).clamp(min=1)).cpu().numpy())
    return np.concatenate(feats) if feats else np.zeros((0, 0))


def probe_figures(
    module: torch.nn.Module,
    train: ProbeSplit,
    dev: ProbeSplit,
    pad_id: int,
    length: int,
    batch_size: int,
    max_seconds: float,
) -> dict[str, float]:
    """Dev and train accuracy of the probe on `module`'s body, with what it used; nan where the time bound left
    fewer than two labels to fit."""
    t0 = time.perf_counter()
    body = feature_body(module)
    was_training = module.training
    module.eval()
    try:
        x_dev = pooled_features(body, dev, pad_id, length, batch_size, t0 + max_seconds)
        x_train = pooled_features(body, train, pad_id, length, batch_size, t0 + max_seconds)
    finally:
        module.train(was_training)
    y_train, y_dev = train.labels[: len(x_train)], dev.labels
    out = {"probe/train_examples": float(len(x_train)), "probe/dev_examples": float(len(dev.labels))}
    if len(x_dev) < len(y_dev) or len(np.unique(y_train)) < 2:
        log.warning(
            f"[probe] eval.probe_max_seconds ({max_seconds:g}) spent after {len(x_dev)}/{len(y_dev)} dev and "
            f"{len(x_train)}/{len(train.labels)} train examples: no probe figure this time"
        )
        return {**out, "probe/accuracy": float("nan"), "probe/seconds": time.perf_counter() - t0}
    if len(x_train) < len(train.labels):
        log.warning(f"[probe] time bound: fitted on {len(x_train)} of {len(train.labels)} train examples")
    clf = fit_linear_probe(x_train, y_train)
    out["probe/accuracy"] = float((clf.predict(x_dev) == y_dev).mean())
    out["probe/train_accuracy"] = float((clf.predict(x_train) == y_train).mean())
    out["probe/seconds"] = time.perf_counter() - t0
    return out


def _encode(
    tokenizer: Any, rows: list[tuple[str, str, str, str | None]], labels: dict[str, int], length: int
) -> ProbeSplit:
    """Rows are (id, text, label, second text or None); a pair task's two texts are framed as its tokenizer frames
    a pair."""
    texts, pairs = [r[1] for r in rows], [r[3] for r in rows]
    second = pairs if any(p is not None for p in pairs) else None
    ids = tokenizer(texts, second, truncation=True, max_length=length, verbose=False)["input_ids"]
    return ProbeSplit(ids, np.asarray([labels[r[2]] for r in rows]))


# Examples per split (train, dev) the probe encodes at most: a fixed subset chosen by id hash. Not a config key:
# its time is bounded by eval.probe_max_seconds, and a test on a tiny task passes its own cap.
PROBE_MAX_EXAMPLES = 512


class TransferProbe:
    """The probe of one run: its task's examples (rank 0 reads and tokenizes them once, at set-up), the
    random-init figure, and `measure` at each eval (rank 0 computes, every rank returns after it)."""

    def __init__(self, cfg: RunConfig, tokenizer: Any, rank: int, max_examples: int = PROBE_MAX_EXAMPLES):
        from data_pipeline.labelled import cap_by_id, load_task

        ev = cfg.eval
        self.task: str = ev.probe_task or ""
        self.rank = rank
        self.max_seconds = ev.probe_max_seconds
        self.batch_size = cfg.finetune.eval_batch_size
        ml = cfg.finetune.max_length
        self.length = min(ml if isinstance(ml, int) else cfg.packing.seq_len, cfg.packing.seq_len)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.random_init: dict[str, float] | None = None
        self.majority = float("nan")  # share of the dev split's most frequent label (rank 0)
        self.train = self.dev = ProbeSplit([], np.zeros(0, np.int64))
        if rank != 0:
            return
        index = [t.name for t in cfg.finetune.tasks].index(self.task)
        data = load_task(cfg, index)
        labels = {name: i for i, name in enumerate(data.labels)}
        cap = max_examples
        self.train = _encode(tokenizer, cap_by_id(data.train, cap, f"{self.task}/probe"), labels, self.length)
        self.dev = _encode(tokenizer, cap_by_id(data.dev, cap, f"{self.task}/probe"), labels, self.length)
        counts = np.bincount(self.dev.labels, minlength=len(labels))
        self.majority = float(counts.max() / max(1, counts.sum()))
        log.info(
            f"[probe] eval.probe_task '{self.task}': {len(self.train.labels)} train / {len(self.dev.labels)} dev "
            f"examples, {len(labels)} labels, {self.length} tokens each, majority class {self.majority:.1%} of dev"
        )

    @classmethod
    def from_config(
        cls, cfg: RunConfig, tokenizer: Any, rank: int, max_examples: int = PROBE_MAX_EXAMPLES
    ) -> TransferProbe | None:
        return cls(cfg, tokenizer, rank, max_examples) if cfg.eval.probe_task else None

    def _run(self, module: torch.nn.Module) -> dict[str, Any]:
        """Rank 0 measures; the others wait at a barrier ({} there)."""
        out: dict[str, Any] = {}
        if self.rank == 0:
            out.update(
                probe_figures(
                    module, self.train, self.dev, self.pad_id, self.length, self.batch_size, self.max_seconds
                )
            )
            out["probe/majority_accuracy"] = self.majority
            out["probe/task"] = self.task  # JSONL only (the numeric sinks skip text)
        if dist.is_initialized():
            dist.barrier()
        return out

    def start(self, module: torch.nn.Module, saved: dict[str, Any] | None, step: int) -> dict[str, Any]:
        """The random-init figure: from the checkpoint's state when it carries one for this task, measured on the
        weights before the first step of a fresh run (returned, for a row at step 0), else none (a probe added on
        resume is not measured on trained weights and called random)."""
        if saved and saved.get("task") == self.task:
            self.random_init = {k: float(v) for k, v in saved.items() if k != "task"}
            return {}
        if step > 0:
            if self.rank == 0:
                log.warning(
                    f"[probe] the checkpoint at step {step} carries no random-init probe figure for task "
                    f"'{self.task}' (the probe was added on resume): none is reported"
                )
            return {}
        row = self._run(module)
        figures = [row.get("probe/accuracy", float("nan")), row.get("probe/train_accuracy", float("nan"))]
        if dist.is_initialized():  # every rank's checkpoint state carries the same figure
            dist.broadcast_object_list(figures, src=0)
        self.random_init = {"accuracy": figures[0], "train_accuracy": figures[1]}
        return self._with_random_init(row)

    def measure(self, module: torch.nn.Module) -> dict[str, Any]:
        return self._with_random_init(self._run(module))

    def _with_random_init(self, row: dict[str, Any]) -> dict[str, Any]:
        if row and self.random_init is not None:
            row["probe/random_init_accuracy"] = self.random_init["accuracy"]
        return row

    def state(self) -> dict[str, Any] | None:
        """What a checkpoint carries (STATE_KEY): the random-init figure, so a resume never measures it again."""
        return None if self.random_init is None else {"task": self.task, **self.random_init}
