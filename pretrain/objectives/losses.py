"""Chunked linear + cross-entropy for causal LM heads (`objective.chunked_loss`): the loss of `hidden @ W.T` without
ever holding the [tokens, vocab] logits, in any precision.

transformers' causal LM forward computes the full logits and its loss upcasts them to fp32: GPT-2 medium at micro
16 x 1024 holds 1.6 GB of bf16 logits, 3.3 GB of fp32 ones and their gradient. Here the tokens are taken a chunk at
a time (at most `MAX_CHUNK_ELEMENTS` logits), and each chunk's gradients with respect to the hidden states and the
head's weight are computed in the forward pass, as Liger's fused linear cross-entropy does, so nothing of the chunk
is kept for backward. The chunk step is one function, which `compile_blocks` compiles beside the blocks so that
the softmax and its gradient fuse into a few kernels.
"""

from __future__ import annotations

import types
from typing import Any

import torch

IGNORE = -100
MAX_CHUNK_ELEMENTS = 1 << 26  # 256 MB of fp32 logits per chunk


def chunk_rows(n_tokens: int, vocab: int) -> int:
    """Tokens per chunk: a power of two (few distinct shapes for the compiled step) within MAX_CHUNK_ELEMENTS."""
    rows = 1 << max(0, (MAX_CHUNK_ELEMENTS // vocab).bit_length() - 1)
    return max(1, min(rows, n_tokens))


def chunk_step(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, grads: bool):
    """Summed loss of one chunk and, when `grads`, d(loss*scale)/dh and /dW (fp32): softmax minus one-hot."""
    acc = torch.promote_types(h.dtype, torch.float32)  # fp32, or fp64 for an fp64 model
    logits = (h @ w.t()).to(acc)
    valid = y != IGNORE
    target = y.clamp(min=0)
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, target[:, None]).squeeze(1)
    loss = torch.where(valid, lse - picked, 0.0).sum()
    if not grads:
        return loss, None, None
    g = torch.exp(logits - lse[:, None])
    g = g - torch.nn.functional.one_hot(target, logits.shape[1]).to(g.dtype)
    g = (g * (valid.to(g.dtype) * scale)[:, None]).to(h.dtype)
    return loss, g @ w, (g.t() @ h).to(acc)


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, step, grads):  # noqa: D102 (autograd protocol)
        n_valid = (labels != IGNORE).sum().clamp(min=1)
        acc = torch.promote_types(hidden.dtype, torch.float32)
        scale = 1.0 / n_valid.to(acc)
        rows = chunk_rows(hidden.shape[0], weight.shape[0])
        total = torch.zeros((), dtype=acc, device=hidden.device)
        grad_h = torch.empty_like(hidden) if grads else hidden.new_empty(0)  # empty: evaluation computes none
        grad_w = torch.zeros(weight.shape if grads else (0,), dtype=acc, device=weight.device)
        for s in range(0, hidden.shape[0], rows):
            loss, gh, gw = step(hidden[s : s + rows], weight, labels[s : s + rows], scale, grads)
            total = total + loss
            if grads:
                grad_h[s : s + rows] = gh
                grad_w += gw
        if grads:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return total * scale

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None, None


def chunked_causal_lm_loss(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, step: Any = chunk_step
) -> torch.Tensor:
    """Mean next-token cross-entropy of `hidden` [B, T, d] through the head `weight` [V, d], labels [B, T] unshifted
    with -100 ignored: the same value and gradients as transformers' `ForCausalLMLoss` over the full logits."""
    shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:]
    flat = hidden.reshape(-1, hidden.shape[-1])
    grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _ChunkedLinearCE.apply(flat, weight, shifted.reshape(-1).to(flat.device), step, grads)


def can_chunk(model: Any) -> str | None:
    """Why `model` cannot take the chunked loss, or None: it needs a causal LM with a bias-free linear head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or not hasattr(model, "base_model"):
        return f"{type(model).__name__} has no bias-free linear LM head over a base model"
    return None


def enable_chunked_loss(model: Any) -> None:
    """Training forwards with labels return the chunked loss (and no logits); without labels the model's own forward
    runs. Set on this instance only: parameter names, checkpoints and exports are unchanged."""
    why = can_chunk(model)
    if why is not None:
        raise ValueError(f"objective.chunked_loss: {why}")
    from transformers.modeling_outputs import CausalLMOutputWithPast

    full_forward = model.forward
    model._lmstack_loss_step = chunk_step

    def forward(self: Any, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        if labels is None:
            return full_forward(input_ids=input_ids, **kwargs)
        kwargs.pop("use_cache", None)
        body = self.base_model(input_ids=input_ids, use_cache=False, **kwargs)
        head = self.get_output_embeddings()
        loss = chunked_causal_lm_loss(body.last_hidden_state, head.weight, labels, self._lmstack_loss_step)
        return CausalLMOutputWithPast(loss=loss)

    model.forward = types.MethodType(forward, model)
