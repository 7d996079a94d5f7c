"""Issue 43 fault 7: what a resumed or signalled training run reports and does, in-process (no DeepSpeed).

- A time-budget resume printed `lr now` from the fresh schedule's warmup floor (before the clock was restored)
  while the next step ran at the restored clock's LR.
- Ctrl-C under plain torchrun (SIGINT to the ranks) died in KeyboardInterrupt with no checkpoint; it now asks
  for a checkpoint at the next step end, as SIGTERM and SIGUSR1 do.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from pretrain.callbacks.preemption import StopRequested
from pretrain.run.schedule import lr_multiplier, make_plan
from pretrain.run.train import TrainingClock
from runconfig import load_config

pytestmark = pytest.mark.timeout(60)


def test_a_time_budget_resume_reports_the_lr_of_the_restored_clock():
    cfg = load_config(
        "configs/roberta-tiny.yaml",
        ["schedule.total_steps=null", "schedule.warmup_steps=null", "schedule.budget_minutes=2"],
    )
    plan = make_plan(cfg, 1)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=plan.peak_lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(cfg, plan))  # fresh: clock at 0
    warmup_floor = scheduler.get_last_lr()[0]
    clock = TrainingClock(cfg, plan, scheduler, elapsed_s=60.0)  # resumed half-way through the budget
    expected = plan.peak_lr * clock.time_schedule(0)
    assert expected > 10 * warmup_floor
    assert clock.lr_now(scheduler) == pytest.approx(expected)


def test_sigint_asks_for_a_checkpoint_like_sigterm():
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        stop = StopRequested()
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the step in hand ends, then a checkpoint
        assert stop.requested and stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: stop now
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
