"""`finetune.optim` (issue 27): adafactor fine-tunes with the T5 paper's Adafactor, whose updates are scaled by
each parameter's RMS, over the Trainer's weight-decay groups; adamw keeps the Trainer's AdamW; a bad name is
refused at load, naming the key."""

from __future__ import annotations

import pytest
import torch
from transformers import Trainer, TrainingArguments
from transformers.optimization import Adafactor

from adapt.transfer import finetune_optimizer
from runconfig import ConfigError, load_config


class _TwoScales(torch.nn.Module):
    """An embedding at T5's std 1 beside a small matrix and a norm, as in a T5 block."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(16, 8)
        self.q = torch.nn.Linear(8, 8, bias=False)
        torch.nn.init.normal_(self.q.weight, std=0.01)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, ids):
        return self.norm(self.q(self.emb(ids))).pow(2).mean()


def _optimizer(tmp_path, optim: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    args = TrainingArguments(
        output_dir=str(tmp_path), learning_rate=1e-3, weight_decay=0.1, use_cpu=True, report_to=[]
    )
    return Trainer(
        model=model, args=args, optimizer_cls_and_kwargs=finetune_optimizer(optim, args.learning_rate)
    ).create_optimizer()


def _relative_step(tmp_path, optim: str) -> dict[str, float]:
    model = _TwoScales()
    opt = _optimizer(tmp_path, optim, model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.arange(16).view(2, 8)).backward()
    opt.step()
    return {
        n: float((p.detach() - before[n]).norm() / before[n].norm())
        for n, p in model.named_parameters()
        if n in ("emb.weight", "q.weight")
    }


def test_adafactor_is_the_papers_with_the_trainers_decay_groups(tmp_path):
    opt = _optimizer(tmp_path, "adafactor", _TwoScales())
    assert isinstance(opt, Adafactor)
    for g in opt.param_groups:
        assert g["scale_parameter"] and not g["relative_step"] and not g["warmup_init"]
        assert g["lr"] == 1e-3 and g["beta1"] is None
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    model_names = dict(_TwoScales().named_parameters()).keys()
    assert len(decayed) == 2 and sum(len(g["params"]) for g in opt.param_groups) == len(model_names)


def test_adafactor_steps_are_relative_to_each_parameter_and_adamws_are_not(tmp_path):
    """The property T5 needs: a std-1 embedding and a 0.01-RMS matrix move by the same fraction of themselves under
    the paper's Adafactor; AdamW moves both by about the LR, i.e. the small matrix ~100x more in relative terms."""
    ada = _relative_step(tmp_path, "adafactor")
    adamw = _relative_step(tmp_path, "adamw")
    assert ada["q.weight"] / ada["emb.weight"] < 3
    assert adamw["q.weight"] / adamw["emb.weight"] > 30


def test_adamw_stays_the_trainers(tmp_path):
    assert type(_optimizer(tmp_path, "adamw", _TwoScales())) is torch.optim.AdamW


def test_an_unknown_fine_tune_optimizer_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"finetune\.optim"):
        load_config("configs/gpt2-tiny.yaml", ["finetune.optim=sgd"])
