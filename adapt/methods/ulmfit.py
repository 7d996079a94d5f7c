"""ULMFiT's fine-tuning schedule (Howard & Ruder 2018, section 3.2-3.3) for any transformers model:

- layer groups: the embeddings (and the body's other non-block weights), each transformer block in depth order,
  then the task head;
- discriminative fine-tuning: group g's LR is the top group's divided by `decay`^(top - g) (the paper's 2.6);
- slanted triangular LR: a linear rise over `cut_frac` of the steps to the peak, then a linear fall, from and to
  peak / `ratio`;
- gradual unfreezing: only the head trains at first; every `unfreeze_every` steps (default: one epoch) the next
  group down joins, until all train.

The Trainer's own AdamW over these groups: a frozen group's weights get no gradient, so AdamW leaves them (and
their weight decay) alone until they are unfrozen.

Torch and transformers are imported inside the functions, and the Trainer classes are made on first use (the
module's `__getattr__`): the config reads `SPEC` (the `finetune.ulmfit` settings) without them.
"""

from __future__ import annotations

import math
import re
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import Field

from core.specs import MethodSpec, Options

if TYPE_CHECKING:
    import torch

_BLOCK = re.compile(r"^(.*)\.(\d+)\.")


class UlmfitSettings(Options):
    """`finetune.ulmfit`: ULMFiT's fine-tuning schedule (Howard & Ruder 2018), with the paper's defaults."""

    decay: float = Field(2.6, ge=1)  # each layer group's LR is the one above's / decay
    cut_frac: float = Field(0.1, gt=0, lt=1)  # slanted triangular: share of steps spent rising
    ratio: float = Field(32, ge=1)  # slanted triangular: peak LR / lowest LR
    # Steps between unfreezing the next layer group (from the top); None: one epoch, as in the paper.
    unfreeze_every: int | None = Field(None, gt=0)


def layer_groups(model: torch.nn.Module) -> list[list[str]]:
    """Parameter names per group, bottom (embeddings) to top (head). A block is an entry of a ModuleList in the
    body (RoBERTa's encoder.layer.i, GPT-2's h.i, T5's encoder.block.i then decoder.block.i)."""
    import torch

    lists = [n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    prefix = getattr(model, "base_model_prefix", "")
    has_body = bool(prefix) and hasattr(model, prefix)
    bottom: list[str] = []
    blocks: dict[tuple[int, int], list[str]] = {}
    head: list[str] = []
    for name, _ in model.named_parameters():
        m = _BLOCK.match(name)
        if m and m.group(1) in lists:
            blocks.setdefault((lists.index(m.group(1)), int(m.group(2))), []).append(name)
        elif has_body and not name.startswith(prefix + "."):
            head.append(name)
        else:
            bottom.append(name)
    return (
        [bottom, *(blocks[k] for k in sorted(blocks)), head]
        if head
        else [bottom, *(blocks[k] for k in sorted(blocks))]
    )


def slanted_triangular(step: int, total: int, cut_frac: float, ratio: float) -> float:
    """The LR multiplier of the paper's equation (3): 1/ratio at step 0, 1 at cut, 1/ratio at the end."""
    cut = max(1, math.floor(total * cut_frac))
    p = step / cut if step < cut else 1 - (step - cut) / max(1, cut * (1 / cut_frac - 1))
    return (1 + max(p, 0.0) * (ratio - 1)) / ratio


@cache
def _trainer_classes() -> dict[str, type]:
    """GradualUnfreezing (a TrainerCallback) and UlmfitTrainer (a Trainer), made once, on first use."""
    import torch
    from transformers import Trainer, TrainerCallback

    class GradualUnfreezing(TrainerCallback):
        """Unfreezes one more layer group from the top every `every` steps (the head trains from step 0). The model
        comes from the Trainer (built by its model_init), so the groups are found when training begins."""

        def __init__(self, every: int, groups_of=layer_groups):
            self.every = max(1, every)
            self.groups_of = groups_of
            self.params: dict[str, torch.nn.Parameter] = {}
            self.groups: list[list[str]] = []

        def apply(self, step: int) -> None:
            open_from = len(self.groups) - 1 - step // self.every  # groups at or above this index train
            for g, names in enumerate(self.groups):
                for n in names:
                    self.params[n].requires_grad_(g >= open_from)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.params, self.groups = dict(model.named_parameters()), self.groups_of(model)
            self.apply(0)

        def on_step_begin(self, args, state, control, **kwargs):
            self.apply(state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            for p in self.params.values():  # the saved and scored model is a whole one
                p.requires_grad_(True)

    class UlmfitTrainer(Trainer):
        """The Trainer with ULMFiT's optimizer groups and schedule (its loop, logging and saving unchanged)."""

        def __init__(self, *args, ulmfit: UlmfitSettings, groups_of=layer_groups, **kwargs):
            self.ulmfit = ulmfit
            self.groups_of = groups_of
            super().__init__(*args, **kwargs)

        def create_optimizer(self, model=None):
            existing: torch.optim.Optimizer | None = getattr(self, "optimizer", None)
            if existing is not None:
                return existing
            model = model or self.model
            groups = self.groups_of(model)
            params = dict(model.named_parameters())
            top = len(groups) - 1
            lr, wd = self.args.learning_rate, self.args.weight_decay
            self.optimizer = torch.optim.AdamW(
                [
                    {
                        "params": [params[n] for n in names],
                        "lr": lr / self.ulmfit.decay ** (top - g),
                        "weight_decay": wd,
                    }
                    for g, names in enumerate(groups)
                    if names
                ],
                lr=lr,
                betas=(self.args.adam_beta1, self.args.adam_beta2),
                eps=self.args.adam_epsilon,
            )
            return self.optimizer

        def create_scheduler(self, num_training_steps: int, optimizer=None):
            if getattr(self, "lr_scheduler", None) is None:
                u = self.ulmfit
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer,
                    lambda step: slanted_triangular(step, num_training_steps, u.cut_frac, u.ratio),
                )
            return self.lr_scheduler

    return {"GradualUnfreezing": GradualUnfreezing, "UlmfitTrainer": UlmfitTrainer}


def __getattr__(name: str) -> Any:
    """`ulmfit.GradualUnfreezing` and `ulmfit.UlmfitTrainer`, whose bases need transformers (PEP 562)."""
    classes = _trainer_classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def trainer(settings: UlmfitSettings, steps_per_epoch: int) -> tuple[type, dict[str, Any], list[Any]]:
    """Its own optimizer groups and schedule (UlmfitTrainer), and one layer group unfrozen every
    `unfreeze_every` steps (default: one epoch)."""
    classes = _trainer_classes()
    unfreeze = classes["GradualUnfreezing"](settings.unfreeze_every or steps_per_epoch)
    return classes["UlmfitTrainer"], {"ulmfit": settings}, [unfreeze]


SPEC = MethodSpec(name="ulmfit", description="ULMFiT schedule", settings=UlmfitSettings, trainer=trainer)
