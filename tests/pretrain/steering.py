"""Callbacks that steer a real training run from the tests, registered on it as an outside plug-in is (a
`module.path:Name` under the run config's `callbacks:`; `override` writes that key). Nothing of them is in the
product: the tests that need a slow rank, a frozen rank or a spike on one rank switch them on for their run only.

- `Delay` (settings `delays: ["RANK:STEP:SECONDS", ...]`): that rank sleeps inside the forward of its first
  micro-batch of that step (STEP `*`: every step); SECONDS `stop` makes it stop itself there with SIGSTOP (a
  frozen process, never continued). The watchdog's own forward hook runs first, so the rank is seen "in the forward".
- `DeviceWait` (settings `kinds`): after every training forward, the waits for the device a GPU step must not pay:
  `synchronize` (the accelerator's) and `nonzero` (an op whose CUDA kernel blocks the host): what the sync counters
  of tests/pretrain/test_host_syncs.py must name.
- `SpikeInjection` (settings `rank`, `step`, `factor`): that rank's losses of that step are multiplied by `factor`
  before they enter the step's all-reduce (a spike only one rank sees), once: a rolled-back rerun of the step is clean.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

from core.callbacks import CONTINUE, Action, Callback, StepOutcome
from core.log import get_logger

MODULE = "tests.pretrain.steering"
STOP_DELAY_S = 0.3  # how far into that forward the "stop" lands: a SIGSTOP comes in the middle of work
log = get_logger(__name__)


def override(**chosen: dict[str, Any]) -> str:
    """`callbacks={...}` for the run's command line: override(Delay={"delays": ["1:3:60"]})."""
    return "callbacks=" + json.dumps({f"{MODULE}:{name}": settings for name, settings in chosen.items()})


def parse_delays(entries: list[str], rank: int) -> dict[int | None, float]:
    """{step (None: every step): seconds} of the entries that name `rank`."""
    out: dict[int | None, float] = {}
    for item in entries:
        who, step, seconds = item.split(":")
        if int(who) == rank:
            out[None if step == "*" else int(step)] = math.inf if seconds == "stop" else float(seconds)
    return out


class DelaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    delays: list[str]

    @field_validator("delays")
    @classmethod
    def _entries(cls, v: list[str]) -> list[str]:
        for item in v:
            parts = item.split(":")
            ok = len(parts) == 3 and parts[0].isdigit() and (parts[1] == "*" or parts[1].isdigit())
            if not ok or not (parts[2] == "stop" or parts[2].replace(".", "", 1).isdigit()):
                raise ValueError(f"{item!r} is not RANK:STEP:SECONDS (STEP may be *, SECONDS stop)")
        return v


class Delay(Callback):
    name = "test_delay"
    Settings: ClassVar[type[BaseModel]] = DelaySettings

    def on_start(self, run: Any, progress: Any) -> None:
        self.rank, self.delay = run.rank, parse_delays(self.settings.delays, run.rank)
        self.step, self.micro = 0, 0
        if self.delay:
            run.engine.register_forward_pre_hook(self._forward_begins)

    def on_step_begin(self, step: int) -> None:
        self.step, self.micro = step, 0

    def _forward_begins(self, module: Any, args: Any) -> None:
        if not module.training:  # evaluation and the parity probe are not training steps
            return
        self.micro += 1
        if self.micro != 1:
            return
        seconds = self.delay.get(None, 0.0) + self.delay.get(self.step, 0.0)
        if math.isinf(seconds):
            time.sleep(STOP_DELAY_S)
            log.warning(f"[test] rank {self.rank} stops itself (SIGSTOP) in the forward of step {self.step}")
            for h in logging.getLogger().handlers + log.handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(seconds if math.isfinite(seconds) else 0.0)


class DeviceWaitSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kinds: list[str]


class DeviceWait(Callback):
    name = "test_device_wait"
    Settings: ClassVar[type[BaseModel]] = DeviceWaitSettings

    def on_forward(self, output: Any) -> None:
        import torch
        from deepspeed.accelerator import get_accelerator

        if "synchronize" in self.settings.kinds:
            get_accelerator().synchronize()
        if "nonzero" in self.settings.kinds:
            torch.nonzero(output.loss.detach().reshape(1))


class InjectionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int
    step: int
    factor: float
    # seconds every rank waits after the spiking step's callbacks have judged it (the spike is logged, the
    # rollback not yet started): a test that kills the run "as the rollback starts" has this long to do it
    hold_s: float = 0.0


class SpikeInjection(Callback):
    name = "test_spike_injection"
    Settings: ClassVar[type[BaseModel]] = InjectionSettings

    def on_start(self, run: Any, progress: Any) -> None:
        self.step, self.done = 0, progress.step >= self.settings.step
        if run.rank == self.settings.rank:
            run.engine.register_forward_hook(self._scaled)

    def on_step_begin(self, step: int) -> None:
        self.step = step

    def _scaled(self, module: Any, args: Any, output: Any) -> Any:
        if module.training and not self.done and self.step == self.settings.step:
            output.loss = output.loss * self.settings.factor
        return output

    def on_step_end(self, outcome: StepOutcome) -> Action:
        if outcome.step == self.settings.step and not self.done:
            self.done = True  # once: a rolled-back rerun of the step is clean
            time.sleep(self.settings.hold_s)
        return CONTINUE


class StepTally(Callback):
    """A callback with state: the steps it saw and their agreed losses, carried in the checkpoints. A resumed run
    must continue it exactly (the fault matrix's "resume with a callback's state")."""

    name = "test_step_tally"

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.steps: list[int] = []
        self.losses: list[float] = []

    def load_state_dict(self, state: Any, step: int) -> None:
        if state:
            self.steps, self.losses = list(state["steps"]), list(state["losses"])

    def on_step_end(self, outcome: StepOutcome) -> Action:
        self.steps.append(outcome.step)
        self.losses.append(outcome.loss)
        return CONTINUE

    def state_dict(self) -> Any:
        return {"steps": list(self.steps), "losses": list(self.losses)}
