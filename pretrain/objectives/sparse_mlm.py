"""Sparse prediction for masked-LM training (ModernBERT, Cramming, MosaicBERT): the prediction head (transform and
vocabulary projection) runs only on the positions that carry a label.

With 15% masking the dense head computes 85% of its vocabulary logits for nothing; on a small model with a 4-8K
vocabulary the head is about 40% of the training FLOPs. The loss is the same mean cross-entropy over the labelled
positions that HF's `*ForMaskedLM` computes (so gradients match up to float reduction order). The model's forward
is replaced on the instance only: its weights, state dict, checkpoints and export are the family's own, and a call
without labels (parity, export checks, feature extraction) takes the original dense path.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from transformers.modeling_outputs import MaskedLMOutput

IGNORE = -100


def _sparse_forward(self: Any, input_ids=None, attention_mask=None, labels=None, **kwargs):
    """The body, then the head on the labelled positions only; without labels, the class's dense forward."""
    if labels is None or kwargs.get("return_dict") is False:
        return type(self).forward(
            self, input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs
        )
    hidden = self.base_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]
    labels = labels.to(hidden.device)
    keep = labels.reshape(-1) != IGNORE
    logits = getattr(self, self._sparse_head)(hidden.reshape(-1, hidden.shape[-1])[keep])
    loss = torch.nn.functional.cross_entropy(logits.float(), labels.reshape(-1)[keep])
    return MaskedLMOutput(loss=loss, logits=logits)


def enable_sparse_prediction(model: Any, head_name: str) -> None:
    """Route labelled forwards of `model` (an HF *ForMaskedLM with `base_model` and the head `head_name`) through
    the body, then the head on the labelled positions only. A method bound to the instance, not a closure over it,
    so `copy.deepcopy(model)` gets a forward bound to the copy."""
    model._sparse_head = head_name
    model.forward = types.MethodType(_sparse_forward, model)
