"""FP8 training (`model.float8`): torchao.float8's `Float8Linear` in place of the decoder blocks' `nn.Linear` layers
(Llama's), and `Float8Conv1D` below for transformers' `Conv1D` (GPT-2's), on torchao's float8 matmul.

torchao is what torchtitan and OLMo-core train in FP8 with: each converted linear casts its input, weight and output
gradient to float8 with a dynamic scale (one per tensor, or one per row with `rowwise`) and runs its three matmuls
on the GPU's float8 units (`torch._scaled_mm`); everything else (embeddings, norms, attention, the LM head) stays in
the run's precision. The weights stay ordinary parameters of that precision under the same names, so DeepSpeed's
ZeRO 0-2, the checkpoints, an exact resume and the export are those of a bf16 run (the export is a plain HF folder:
nothing float8 is saved). The export-parity probe runs the blocks in high precision
(`pretrain.checkpoint.parity.high_precision`): the
exported model computes that function, and the float8 casts would otherwise hide a conversion bug in their noise.

The layers converted are exactly those the family declares (`FamilySpec.float8_linears`), in every repeated block
(`pretrain.run.models.repeated_blocks`); a block that holds others, or lacks one, stops the run before training.
"""

from __future__ import annotations

import dataclasses

import torch

from core.errors import ConfigError
from core.log import get_logger
from pretrain.run.models import repeated_blocks
from runconfig.model import ModelConfig

log = get_logger(__name__)

MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards


def check_device(m: ModelConfig, device: torch.device) -> None:
    """Refuse FP8 on a device without float8 matmuls, naming the key (emulation runs anywhere): `pretrain train`'s
    preflight, before anything is built, and the run's set-up for callers of `train` itself. `device`: this rank's
    accelerator device."""
    if m.float8 == "none" or m.float8_emulate:
        return
    if device.type != "cuda":
        raise ConfigError(
            f"model.float8: {m.float8} needs a CUDA GPU of compute capability >= 8.9 (this rank trains on "
            f"{device.type}); model.float8_emulate: true runs torchao's emulation instead (tests, no speed-up)"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        raise ConfigError(
            f"model.float8: {m.float8} needs compute capability >= 8.9 (Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}: use model.float8: none"
        )


def _import_torchao():
    """torchao.float8, or an error naming the key and the extra that installs it. (transformers imports torchao
    itself where it is installed; its import warnings go to the run's third_party.log, core/log.py.)"""
    try:
        from torchao import float8
    except ImportError as e:
        raise ValueError(
            "model.float8: needs torchao (`pip install 'lmstack[fp8]'`; docs/training.md names the version)"
        ) from e
    return float8


class Float8Conv1D(torch.nn.Module):
    """transformers' `Conv1D` (GPT-2's projections) with torchao's float8 matmuls. Conv1D computes x @ weight + bias
    with its weight stored [in, out], which is the transposed weight torchao's Float8Linear hands its matmul
    (`self.weight.t()`), so the same autograd function takes the stored weight as it is. Written here because torchao
    converts `nn.Linear` only, and converting GPT-2 to nn.Linear would transpose every weight in the checkpoints and
    the export. Uses torchao's `matmul_with_hp_or_float8_args` (not public; torchao is pinned, pyproject.toml)."""

    def __init__(self, conv: torch.nn.Module, config) -> None:
        from torchao.float8.float8_linear import Float8Linear

        super().__init__()
        self.nf, self.nx = conv.nf, conv.nx
        self.weight, self.bias = conv.weight, conv.bias  # the same parameters: DeepSpeed's, the checkpoint's
        with torch.device("meta"):  # Float8Linear's own derivation of the matmul settings from the config
            ref = Float8Linear(conv.nx, conv.nf, bias=False, config=config)
        self.config, self.linear_mm_config = config, ref.linear_mm_config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        out = matmul_with_hp_or_float8_args.apply(x, self.weight, self.linear_mm_config, self.config)
        return out + self.bias.to(out.dtype)

    def plain_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Conv1D's own forward (`pretrain.checkpoint.parity.high_precision` runs it for the parity probe)."""
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}, recipe={self.config.cast_config_input.scaling_granularity.name}"


def _is_conv1d(module: torch.nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def _block_linears(block: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The block's nn.Linear and transformers Conv1D layers by their path inside it."""
    return {n: x for n, x in block.named_modules() if isinstance(x, torch.nn.Linear) or _is_conv1d(x)}


def _widths(layer: torch.nn.Module) -> tuple[int, int]:
    return (layer.nx, layer.nf) if _is_conv1d(layer) else (layer.in_features, layer.out_features)


def convert(module: torch.nn.Module, m: ModelConfig) -> list[str]:
    """Swap the declared block linears for torchao's Float8Linear (nn.Linear) or Float8Conv1D (transformers'
    Conv1D) in place, before DeepSpeed and torch.compile wrap the module; returns the converted modules' names. A
    no-op with `model.float8: none`."""
    if m.float8 == "none":
        return []
    spec = m.spec
    if spec.float8_linears is None:  # the config check refuses this first
        raise ValueError(f"model.float8: family '{m.family}' declares no float8_linears")
    declared = spec.float8_linears(m)
    blocks = repeated_blocks(module)
    if not blocks:
        raise ValueError(f"model.float8: no repeated blocks found in the {type(module).__name__} module")
    targets: set[int] = set()
    for i, block in enumerate(blocks):
        found = _block_linears(block)
        if set(found) != set(declared):
            raise ValueError(
                f"model.float8: block {i} ({type(block).__name__}) holds the linears {sorted(found)}, the family "
                f"declares {sorted(declared)}"
            )
        for name, lin in found.items():
            if _widths(lin) != declared[name]:
                raise ValueError(
                    f"model.float8: block {i}'s {name} is {_widths(lin)[0]}x{_widths(lin)[1]}, declared "
                    f"{declared[name][0]}x{declared[name][1]}"
                )
            targets.add(id(lin))
    float8 = _import_torchao()
    config = dataclasses.replace(
        float8.Float8LinearConfig.from_recipe_name(m.float8), emulate=m.float8_emulate
    )
    names: list[str] = []

    def chosen(mod: torch.nn.Module, fqn: str) -> bool:
        if id(mod) in targets:
            names.append(fqn)
            return True
        return False

    float8.convert_to_float8_training(module, config=config, module_filter_fn=chosen)
    for name, conv in [(n, x) for n, x in module.named_modules() if id(x) in targets and _is_conv1d(x)]:
        owner, _, attr = name.rpartition(".")
        setattr(module.get_submodule(owner), attr, Float8Conv1D(conv, config))
        names.append(name)
    log.info(
        f"[train] FP8 ({m.float8}{', emulated' if m.float8_emulate else ''}): {len(names)} linears in "
        f"{len(blocks)} blocks; embeddings and the head stay high precision"
    )
    return names
