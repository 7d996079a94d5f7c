"""The frozen-body method (feature extraction, the NAACL 2019 tutorial's first option): the body never trains.

- probe per layer: each layer's mean-pooled states (embeddings = layer 0) -> logistic regression, scored on dev
  and test ("which layer carries the task", pretrained against random init);
- ELMo's scalar mix (Peters et al. 2018): softmax-normalised weights over all layers and a scale gamma, then a
  linear classifier, trained on the pooled states (pooling is linear, so mixing pooled states is mixing states);
  its LR is picked on dev, its test accuracy is the method's figure per seed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from core.log import get_logger
from core.specs import MethodSpec, Options

if TYPE_CHECKING:
    import torch

    from adapt.transfer import PreparedTask
    from runconfig.finetune import FinetuneConfig

logger = get_logger(__name__)

# The scalar mix's learning rates, picked on dev: an internal default (issue 65 item 7), no longer a
# `finetune.frozen` key.
MIX_LR_GRID = (1e-3, 1e-2, 1e-1)


class FrozenSettings(Options):
    """`finetune.frozen`: the frozen-body method, a logistic-regression probe per layer and an ELMo-style scalar
    mix."""

    mix_steps: int = Field(300, gt=0)  # full-batch Adam steps of the scalar mix and its linear head


def layer_features(body: torch.nn.Module, collate: Callable, enc, ft: FinetuneConfig) -> np.ndarray:
    """[examples, layers + 1, hidden]: each layer's mean-pooled states per example (averaged over its windows)."""
    import torch

    body.eval()
    device = next(body.parameters()).device
    feats: np.ndarray | None = None
    counts = np.bincount(enc.owner, minlength=len(enc.gold))[:, None, None]
    with torch.no_grad():
        for s in range(0, len(enc.features), ft.eval_batch_size):
            batch = {k: v.to(device) for k, v in collate(enc.features[s : s + ft.eval_batch_size]).items()}
            mask = batch["attention_mask"].unsqueeze(-1).float()
            out = body(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                output_hidden_states=True,
            )
            h = torch.stack([x.float() for x in out.hidden_states], 1)  # [b, L+1, t, d]
            pooled = ((h * mask.unsqueeze(1)).sum(2) / mask.sum(1).clamp(min=1).unsqueeze(1)).cpu().numpy()
            if feats is None:
                feats = np.zeros((len(enc.gold), pooled.shape[1], pooled.shape[2]))
            np.add.at(feats, enc.owner[s : s + ft.eval_batch_size], pooled)
    assert feats is not None, "no examples to pool"
    return feats / counts


def probe_layers(
    x: dict[str, np.ndarray], gold: dict[str, np.ndarray], regression: bool = False
) -> list[dict[str, Any]]:
    """A standardised logistic (regression: ridge) regression per layer, fit on train, scored on dev and test
    (accuracy, or Pearson's r)."""
    from adapt.probes import linear_probe
    from adapt.scoring import score

    out = []
    for layer in range(x["train"].shape[1]):
        clf = linear_probe(regression)
        clf.fit(x["train"][:, layer], gold["train"])
        row: dict[str, Any] = {"layer": layer}
        for split in ("dev", "test"):
            row[split] = (
                score(clf.predict(x[split][:, layer]), gold[split], regression) if len(gold[split]) else None
            )
        out.append(row)
    return out


@cache
def _scalar_mix() -> type:
    """The ScalarMix module class, made on first use (its base is torch's)."""
    import torch

    class ScalarMix(torch.nn.Module):
        """ELMo's task-specific layer combination: gamma * sum_j softmax(s)_j * h_j, then a linear classifier."""

        def __init__(self, layers: int, hidden: int, classes: int):
            super().__init__()
            self.scalars = torch.nn.Parameter(torch.zeros(layers))
            self.gamma = torch.nn.Parameter(torch.ones(()))
            self.norm = torch.nn.LayerNorm(hidden, elementwise_affine=False)  # layers differ in scale
            self.head = torch.nn.Linear(hidden, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = self.scalars.softmax(0)
            return self.head(self.gamma * (w[None, :, None] * self.norm(x)).sum(1))

    return ScalarMix


def fit_scalar_mix(
    x_train: np.ndarray, y_train: np.ndarray, classes: int, lr: float, steps: int, seed: int
) -> torch.nn.Module:
    """Full-batch Adam on the pooled layer states (seeded: the head's init is the only randomness); classes=1 is
    regression (one output, MSE)."""
    import torch

    torch.manual_seed(seed)
    mix = _scalar_mix()(x_train.shape[1], x_train.shape[2], classes)
    x = torch.tensor(x_train, dtype=torch.float32)
    y = torch.tensor(y_train, dtype=torch.float32 if classes == 1 else torch.long)
    opt = torch.optim.Adam(mix.parameters(), lr=lr, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        out = mix(x)
        loss = (
            torch.nn.functional.mse_loss(out[:, 0], y)
            if classes == 1
            else torch.nn.functional.cross_entropy(out, y)
        )
        loss.backward()
        opt.step()
    return mix


def predict_mix(mix: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = mix(torch.tensor(x, dtype=torch.float32))
        return out[:, 0].numpy() if out.shape[-1] == 1 else out.argmax(-1).numpy()


def frozen_arm(
    task: PreparedTask,
    arm: str,
    name: str,
    settings: FrozenSettings,
    log: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """The frozen-body method for one arm: a probe on every layer's pooled states (seed 0's body) and the ELMo
    scalar mix, whose LR is picked on dev with the first seed and whose test accuracy is taken over every seed
    (each seed: the random arm's body and the mix's head differ)."""
    from transformers import set_seed

    from adapt.inputs import Collator
    from adapt.report import accuracy_text
    from adapt.scoring import collapse, pick_lr, score
    from adapt.statistics import aggregate_seeds

    ft, enc = task.ft, task.enc
    collate = Collator(task.tok.pad_token_id)
    seed0 = ft.seeds[0]
    gold = {s: enc[s].gold for s in ("train", "dev", "test")}
    reg = task.arms.regression
    n_classes = 1 if reg else len(task.arms.labels)
    cache: dict[str, np.ndarray] = {}

    def features(seed: int) -> dict[str, np.ndarray]:
        if arm == "pretrained" and cache:  # the same weights for every seed
            return cache
        set_seed(seed)
        body = task.arms.encoder(arm)
        x = {s: layer_features(body, collate, enc[s], ft) for s in ("train", "dev", "test")}
        if arm == "pretrained":
            cache.update(x)
        return x

    x = features(seed0)
    layers = probe_layers(x, gold, reg)
    dev_acc, dev_collapsed, mixes = {}, {}, {}
    for lr in MIX_LR_GRID:
        mixes[lr] = fit_scalar_mix(x["train"], gold["train"], n_classes, lr, settings.mix_steps, seed0)
        pred = predict_mix(mixes[lr], x["dev"])
        dev_acc[lr] = score(pred, gold["dev"], reg) if len(pred) else 0.0
        dev_collapsed[lr] = collapse(pred, gold["dev"], reg) is not None
    best = pick_lr(list(MIX_LR_GRID), dev_acc, dev_collapsed)
    test_by_seed, collapsed_by_seed = {}, {}
    for seed in ft.seeds:
        xs = x if seed == seed0 else features(seed)
        mix = (
            mixes[best]
            if seed == seed0
            else fit_scalar_mix(xs["train"], gold["train"], n_classes, best, settings.mix_steps, seed)
        )
        pred = predict_mix(mix, xs["test"])
        test_by_seed[seed] = score(pred, gold["test"], reg)
        collapsed_by_seed[seed] = collapse(pred, gold["test"], reg)
    by_dev = max(layers, key=lambda r: (r["dev"] if r["dev"] is not None else -1.0, r["layer"]))
    entry: dict[str, Any] = {
        "lr": best,
        "dev_accuracy_by_lr": {f"{k:g}": v for k, v in dev_acc.items()},
        **aggregate_seeds(test_by_seed, collapsed_by_seed),
        "steps": settings.mix_steps,
        "layers": layers,
        "best_layer": by_dev["layer"],  # picked on dev
        "best_layer_test_accuracy": by_dev["test"],
        "last_layer_test_accuracy": layers[-1]["test"],
        "mix_weights": [round(float(w), 4) for w in mixes[best].scalars.detach().softmax(0)],
    }
    log(
        f"[transfer] {name} frozen/{arm:<10} scalar mix lr {best:g}: test {accuracy_text(entry)}; layer "
        f"{by_dev['layer']} (best on dev) {by_dev['test']:.3f}, last layer {layers[-1]['test']:.3f}"
    )
    return entry


def layers_text(entry: dict[str, Any]) -> str:
    """The report line's layer probes: the layer best on dev beside the last layer."""
    return (
        f"  layer {entry['best_layer']} (dev-best) {entry['best_layer_test_accuracy']:.3f}, "
        f"last layer {entry['last_layer_test_accuracy']:.3f}"
    )


SPEC = MethodSpec(
    name="frozen",
    description="frozen body, scalar mix of all layers",
    settings=FrozenSettings,
    evaluate_arm=frozen_arm,
    report_text=layers_text,
)
