"""Full fine-tuning: every weight trained with the HF Trainer (finetune.optim, a linear schedule), the arm pair of
the transfer protocol since before adaptation methods had a name. Its results are each task's own `arms` in
transfer.json, and it alone reports the frozen-feature probe and the body's token cosine."""

from __future__ import annotations

from core.specs import MethodSpec

SPEC = MethodSpec(name="full", description="fine-tuned", primary=True)
