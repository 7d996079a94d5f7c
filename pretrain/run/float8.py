"""FP8 training (`model.float8`): torchao.float8's `Float8Linear` in place of the decoder blocks' `nn.Linear` layers.

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

from core.log import get_logger
from pretrain.run.models import repeated_blocks
from runconfig.model import ModelConfig

log = get_logger(__name__)

MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards


def check_device(m: ModelConfig, device: torch.device) -> None:
    """Refuse FP8 on a device without float8 matmuls before anything is built, naming the key (emulation runs
    anywhere). `device`: this rank's accelerator device."""
    if m.float8 == "none" or m.float8_emulate:
        return
    if device.type != "cuda":
        raise ValueError(
            f"model.float8: {m.float8} needs a CUDA GPU of compute capability >= 8.9 (this rank trains on "
            f"{device.type}); model.float8_emulate: true runs torchao's emulation instead (tests, no speed-up)"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        raise ValueError(
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


def convert(module: torch.nn.Module, m: ModelConfig) -> list[str]:
    """Swap the declared block linears for torchao's Float8Linear in place (before DeepSpeed and torch.compile
    wrap the module); returns the converted modules' names. A no-op with `model.float8: none`."""
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
        found = {n: x for n, x in block.named_modules() if isinstance(x, torch.nn.Linear)}
        if set(found) != set(declared):
            raise ValueError(
                f"model.float8: block {i} ({type(block).__name__}) holds the linears {sorted(found)}, the family "
                f"declares {sorted(declared)}"
            )
        for name, lin in found.items():
            if (lin.in_features, lin.out_features) != declared[name]:
                raise ValueError(
                    f"model.float8: block {i}'s {name} is {lin.in_features}x{lin.out_features}, declared "
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
    log.info(
        f"[train] FP8 ({m.float8}{', emulated' if m.float8_emulate else ''}): {len(names)} linears in "
        f"{len(blocks)} blocks; embeddings and the head stay high precision"
    )
    return names
