"""μP (`model.parametrization: mup`): Tensor Programs V (Yang et al. 2022), the Adam column of its Table 3 in the
"output multiplier" form of the `mup` package (MuReadout / MuSharedReadout), relative to a base width.

With m = model.hidden_size / model.mup_base_width:
- hidden weights (every 2-D weight but the embeddings and the readout): init std x 1/sqrt(m) (variance
  1/fan_in), Adam LR x 1/m;
- embeddings, biases and norms (vector-like): init and LR as the base model's;
- the readout: logits x 1/m (applied to the output of the norm before it, so a tied readout, and the chunked loss
  that reads the hidden states, get it too); its weight is vector-like (the embedding's when tied);
- attention: scores x 1/head_dim instead of 1/sqrt(head_dim).

Written here rather than with the `mup` package: that package wraps modules (MuReadout) and its own optimizers
(MuAdam), which DeepSpeed's engine and ZeRO-3 partitioning do not see; here the model stays the family's
transformers class, the multipliers are forward hooks and attributes, and the LR scales are the parameter groups
DeepSpeed's optimizer receives. The export folds the multipliers into the weights (the readout norm's affine by
1/m, the query projection by sqrt(head_dim)/head_dim), so the folder is a standard one whose logits are the
engine's (the export parity check).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from runconfig.model import ModelConfig

HOOK = "_lmstack_mup_hook"


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module:
    out: Any = model
    for part in path.split("."):
        out = getattr(out, part)
    return out


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention modules whose score scale transformers reads from `scaling` (GPT-2, Llama, RoBERTa)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "scaling") and (hasattr(m, "head_dim") or hasattr(m, "attention_head_size"))
    ]


def _head_dim(attn: torch.nn.Module) -> int:
    return int(getattr(attn, "head_dim", None) or attn.attention_head_size)


def readout(model: torch.nn.Module, m: ModelConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    assert m.spec.mup_readout is not None
    norm_path, linear_path = m.spec.mup_readout
    return _module(model, norm_path), _module(model, linear_path)


def hidden_parameters(model: torch.nn.Module, m: ModelConfig) -> set[int]:
    """ids of the matrix-like parameters: 2-D weights outside the embeddings and the readout."""
    _, head = readout(model, m)
    vector_like = {
        id(p) for mod in model.modules() if isinstance(mod, torch.nn.Embedding) for p in mod.parameters()
    }
    vector_like |= {id(p) for p in head.parameters()}
    return {id(p) for p in model.parameters() if p.ndim == 2 and id(p) not in vector_like}


def _scale_output(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * _module._lmstack_mup_out


def prepare(model: torch.nn.Module, m: ModelConfig) -> torch.nn.Module:
    """The forward-time multipliers on a freshly built module (every module the run builds: engine, probe,
    export). No-op for SP."""
    if m.parametrization != "mup":
        return model
    attns = attention_modules(model)
    if not attns:
        raise ValueError(
            f"model.parametrization: mup needs attention modules with a `scaling` attribute (transformers >= 5); "
            f"{type(model).__name__} has none"
        )
    for attn in attns:
        attn.scaling = 1.0 / _head_dim(attn)
    norm, _ = readout(model, m)
    norm._lmstack_mup_out = 1.0 / m.width_mult
    setattr(norm, HOOK, norm.register_forward_hook(_scale_output))
    return model


@torch.no_grad()
def scale_init(model: torch.nn.Module, m: ModelConfig) -> None:
    """Hidden weights' init std x 1/sqrt(m), keeping the family's own init pattern (GPT-2's scaled projections)."""
    if m.parametrization != "mup":
        return
    hidden = hidden_parameters(model, m)
    factor = 1.0 / math.sqrt(m.width_mult)
    for p in model.parameters():
        if id(p) in hidden:
            p.mul_(factor)


def lr_scales(model: torch.nn.Module, m: ModelConfig) -> dict[int, float]:
    """{id(parameter): its LR multiplier}: 1/m for hidden weights under μP; parameters not listed: 1."""
    if m.parametrization != "mup":
        return {}
    return dict.fromkeys(hidden_parameters(model, m), 1.0 / m.width_mult)


@torch.no_grad()
def fold(model: torch.nn.Module, m: ModelConfig) -> None:
    """The multipliers folded into the weights and removed: the module is then the family's standard one, with
    the same logits. For the export only (the module is not trained on after)."""
    if m.parametrization != "mup":
        return
    norm, _ = readout(model, m)
    hook = getattr(norm, HOOK, None)
    if hook is not None:
        hook.remove()
        delattr(norm, HOOK)
    for p in norm.parameters():  # LayerNorm's weight and bias, RMSNorm's weight: y/m = (w/m) x + b/m
        p.mul_(norm._lmstack_mup_out)
    del norm._lmstack_mup_out
    for attn in attention_modules(model):
        d = _head_dim(attn)
        q_scale = math.sqrt(d) / d  # scores x 1/d = (q x sqrt(d)/d) k x 1/sqrt(d)
        _scale_query(attn, q_scale)
        attn.scaling = d**-0.5


def _scale_query(attn: torch.nn.Module, factor: float) -> None:
    for name in ("q_proj", "query"):
        lin = getattr(attn, name, None)
        if lin is not None:
            lin.weight.mul_(factor)
            if getattr(lin, "bias", None) is not None:
                lin.bias.mul_(factor)
            return
    c_attn = getattr(attn, "c_attn", None)  # GPT-2's fused Conv1D: weight (in, 3 x hidden), query first
    if c_attn is None:
        raise ValueError(f"μP export: no query projection found in {type(attn).__name__}")
    split = attn.split_size
    c_attn.weight[:, :split].mul_(factor)
    c_attn.bias[:split].mul_(factor)
