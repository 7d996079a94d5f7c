"""Frozen-feature probes of a body: mean-pooled last hidden states -> logistic regression, and the token-state
cosine that flags a body ignoring its input."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import set_seed

from adapt.inputs import Collator, Encoded, model_device, on_device
from pretrain.run.probe_eval import fit_linear_probe
from runconfig.finetune import FinetuneConfig

if TYPE_CHECKING:  # a type only: the arms build models through the methods, which read these probes
    from adapt.arms import Arms


def pooled(model: torch.nn.Module, tok, enc: Encoded, ft: FinetuneConfig) -> np.ndarray:
    """Mean-pooled last hidden state per example (averaged over its windows)."""
    collate = Collator(tok.pad_token_id)
    model.eval()
    feats: np.ndarray | None = None
    device = model_device(model)
    counts = np.bincount(enc.owner, minlength=len(enc.gold))[:, None]
    with torch.no_grad():
        for s in range(0, len(enc.features), ft.eval_batch_size):
            batch = on_device(collate(enc.features[s : s + ft.eval_batch_size]), device)
            mask = batch["attention_mask"].unsqueeze(-1).float()
            h = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state.float()
            pooled = ((h * mask).sum(1) / mask.sum(1).clamp(min=1)).cpu().numpy()
            if feats is None:
                feats = np.zeros((len(enc.gold), pooled.shape[1]))
            np.add.at(feats, enc.owner[s : s + ft.eval_batch_size], pooled)
    assert feats is not None, "no examples to pool"
    return feats / counts


# A body whose last-layer token states all point the same way (mean pairwise cosine above this) ignores its input:
# what a pretraining run stuck on its prior produces (an ELECTRA discriminator at the replaced-fraction entropy,
# a T5 encoder on the unigram plateau). Fine-tunes from it start from a constant and tend to collapse.
DEGENERATE_TOKEN_COSINE = 0.95


def token_cosine(
    body: torch.nn.Module, tok, enc: Encoded, ft: FinetuneConfig, n_tokens: int = 512, seed: int = 0
) -> float:
    """Mean pairwise cosine similarity of the body's last-layer states over `n_tokens` real tokens drawn from the
    first examples of `enc`: near 1 when every token maps to the same vector (random init: ~0.3-0.4)."""
    collate = Collator(tok.pad_token_id)
    body.eval()
    batch = on_device(collate(enc.features[: ft.eval_batch_size]), model_device(body))
    with torch.no_grad():
        h = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    states = h[batch["attention_mask"].bool()].float().cpu()
    pick = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed))[:n_tokens]
    x = torch.nn.functional.normalize(states[pick], dim=-1)
    n = len(x)
    return float(((x @ x.T).sum() - n) / max(1, n * n - n))


def linear_probe(regression: bool):
    """The probe on frozen features: for classification the in-loop probe's classifier of pretraining
    (eval.probe_task: standardised logistic regression), for a float label a standardised ridge regression.
    Returns an object with fit(x, y) -> itself and predict(x)."""
    if not regression:
        return _Deferred(fit_linear_probe)
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), Ridge(alpha=1.0))


class _Deferred:
    """fit(x, y) through a function that fits and returns the fitted classifier (pretrain.run.probe_eval's)."""

    def __init__(self, fit):
        self._fit = fit
        self._clf = None

    def fit(self, x, y):
        self._clf = self._fit(x, y)
        return self

    def predict(self, x):
        if self._clf is None:
            raise RuntimeError("predict before fit")
        return self._clf.predict(x)


def probe(arms: Arms, arm: str, tok, train: Encoded, test: Encoded, ft: FinetuneConfig, seed: int) -> float:
    """The same classifier as the in-loop probe of pretraining (eval.probe_task), on this arm's body, scored by
    the task's metric (accuracy, or Pearson's r with a ridge regression for a regression task)."""
    from adapt.scoring import score

    set_seed(seed)
    body = arms.encoder(arm)
    x_train, x_test = pooled(body, tok, train, ft), pooled(body, tok, test, ft)
    clf = linear_probe(arms.regression).fit(x_train, train.gold)
    return score(clf.predict(x_test), test.gold, arms.regression)
