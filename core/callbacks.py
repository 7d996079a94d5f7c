"""The callback contract: every in-loop behaviour of a training run (the hang watchdog, the loss-spike policy, the
in-loop probe, the profiler window, the metrics sinks, the preemption signal, an outside guard) is a `Callback`
that the loop runs without knowing it by name (OLMo-core's `train/callbacks/`, llm-foundry's `Callback`).

A callback is one class with a `name`, its typed `Settings` (a pydantic section: unknown keys and wrong types are
refused when the config loads, naming the valid keys) and the hooks it needs; every hook has a no-op default. It
is registered as every other kind is: an entry point of the `lmstack.callbacks` group (the built-ins' are in
pyproject.toml, one line each), or a `module.path:Name` value under the run config's `callbacks:` key. The config
loader imports the class to read its `Settings`, so keep heavy imports (torch) inside the hooks, as a family's
spec module does.

Agreement. Every rank runs the same hooks at the same steps with the same agreed figures (`StepOutcome`: the loss
all ranks reduced, the non-finite count, the votes), so a decision taken from them is the same on every rank and
needs no collective of its own. A callback that decides from what only its rank sees (a signal, a file, local
memory) returns it from `vote`: the loop sums the votes in the step's one existing all-reduce (StepSync) and hands
the sums back in `outcome.votes`. A callback that must withhold the update before it is applied (a loss spike)
returns a device flag from `judge`, computed from the reduced figures on the device; it joins the non-finite skip.

Actions (`on_step_end` returns one; the most severe wins): continue, roll back to the last complete checkpoint (the
loop reloads it and hands each callback its saved state via `on_restore`), requeue (checkpoint and exit
PREEMPTED), or stop with the callback's exit code (the last save completes first).

This module imports nothing but the standard library and pydantic: the config checks read it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

__all__ = ["CONTINUE", "Action", "ActionKind", "Callback", "StepOutcome"]


class ActionKind(enum.IntEnum):
    """What the loop does after a step; the most severe of the callbacks' actions is carried out."""

    CONTINUE = 0
    ROLLBACK = (
        1  # reload the last complete checkpoint, keep the loader where it is (the data since is skipped)
    )
    REQUEUE = 2  # checkpoint at this step and exit PREEMPTED (the scheduler requeues the job)
    STOP = 3  # exit with `exit_code`; the last complete checkpoint is left as it was


@dataclass(frozen=True)
class Action:
    """A callback's decision for the step just ended. `reason` is what the run logs; `exit_code` is a STOP's;
    `max_repeats` bounds how often a ROLLBACK may return to the same checkpoint (a trigger that recurs after each
    reload would roll back for ever): past it the run stops with `exit_code`."""

    kind: ActionKind = ActionKind.CONTINUE
    reason: str = ""
    exit_code: int | None = None
    max_repeats: int | None = None
    limit: str = ""  # the setting that bounds the repeats, named when the run stops on it
    by: str = ""  # the callback's name (set by the loop)

    @classmethod
    def stop(cls, reason: str, exit_code: int) -> Action:
        return cls(ActionKind.STOP, reason, exit_code)

    @classmethod
    def rollback(
        cls, reason: str, max_repeats: int | None = None, exit_code: int | None = None, limit: str = ""
    ) -> Action:
        return cls(ActionKind.ROLLBACK, reason, exit_code, max_repeats, limit)

    @classmethod
    def requeue(cls, reason: str) -> Action:
        return cls(ActionKind.REQUEUE, reason)


CONTINUE = Action()


@dataclass
class StepOutcome:
    """One optimizer step as every rank agreed it (StepSync's one collective and one host read)."""

    step: int  # the step just ended (1-based)
    loss: float  # the agreed mean loss over micro-batches and ranks (non-finite ones left out)
    ok: bool  # no rank saw a non-finite loss
    first_batch_at: float  # when its first micro-batch was in hand (perf_counter)
    withheld: dict[str, bool] = field(
        default_factory=dict
    )  # callback name -> its `judge` withheld the update
    votes: dict[str, float] = field(default_factory=dict)  # callback name -> its `vote`, summed over ranks

    @property
    def applied(self) -> bool:
        """The update was applied (finite everywhere and no callback withheld it)."""
        return self.ok and not any(self.withheld.values())


class Callback:
    """Base of every callback: no-op hooks, subclassed as needed. `settings` is the validated `Settings` (or the
    built-in's section of the run config, `section`); `on_start` receives the run (config, rank, world, engine,
    loaders, layout: pretrain/run/train.py `Run`)."""

    name: ClassVar[str] = ""
    # typed settings, validated at load from `callbacks.<name>` in the run YAML; None: the callback takes none
    Settings: ClassVar[type[BaseModel] | None] = None
    # a built-in whose settings are a section of the run config (watchdog, spikes, ...): that section's path. A
    # callback with a section is always on (the section's keys switch its behaviour); one without runs when the
    # config names it under `callbacks:` (with its `Settings`), unless it is `always` on (no settings at all)
    section: ClassVar[str | None] = None
    always: ClassVar[bool] = False
    votes: ClassVar[bool] = False  # it implements `vote` (a slot in the step's all-reduce)
    judges: ClassVar[bool] = False  # it implements `judge` (a device flag that withholds the update)

    def __init__(self, settings: Any = None) -> None:
        self.settings = settings
        self.key = self.name  # the name it is registered under (set by the loop): its checkpoint state's key

    def enabled(self) -> bool:
        """False: the loop leaves it out (its settings switch it off), so a run without it pays nothing."""
        return True

    # --- set-up and end
    def on_start(self, run: Any, progress: Any) -> dict[str, Any] | None:
        """Before the first step, after `load_state_dict` (a resume's state, or None). May return an eval row to
        log at this step."""
        return None

    def on_end(self, run: Any, progress: Any) -> None:
        """After the last step (also after a requeue); every rank calls it. `progress.step` is the last step."""

    # --- the step (the hot path: no host read of a device tensor here)
    def on_step_begin(self, step: int) -> None:
        """Before the first micro-batch of `step` (1-based)."""

    def on_batch(self, step: int, micro: int, batch: dict[str, Any]) -> None:
        """A micro-batch in hand on the host, before its copy to the device and its forward."""

    def on_forward(self, output: Any) -> None:
        """A micro-batch's model output (device tensors; no host read)."""

    def vote(self) -> float:
        """This rank's own figure for the step (a host float, no device read), summed over ranks."""
        return 0.0

    def judge(self, loss_sum: Any, n_bad: Any, per_step: int) -> Any:
        """On the device, after the all-reduce and before the optimizer step: a nonzero float64 tensor withholds
        the update on every rank (the figures are the agreed ones)."""
        return None

    def on_step_end(self, outcome: StepOutcome) -> Action:
        """The agreed step, after its one host read: what the loop does next."""
        return CONTINUE

    # --- logging, evaluation, checkpoints
    def metrics(self, step: int, loader_wait_s: float) -> dict[str, float]:
        """Figures for the training row at a logging step (every rank calls it at the same steps)."""
        return {}

    def on_log(self, step: int, row: dict[str, Any], prefix: str) -> None:
        """A metrics row (train or eval) the run logs: what a metrics sink writes."""

    def on_eval(self, run: Any, step: int) -> dict[str, Any]:
        """At an evaluation step, after the eval loss: figures for the eval row (rank 0's; every rank calls it)."""
        return {}

    def on_save(self, step: int) -> None:
        """A checkpoint at `step` was started."""

    def on_restore(self, state: Any, step: int, record: dict[str, Any] | None = None) -> None:
        """A rollback reloaded the checkpoint at `step`: its saved `state_dict` for this callback (None if it
        carried none) and the rollback's record (at_step, to_step, from_sample, to_sample, reason)."""

    def state_dict(self) -> Any:
        """What a checkpoint carries for this callback (plain values); None: nothing."""
        return None

    def load_state_dict(self, state: Any, step: int) -> None:
        """A resumed run's state from its checkpoint (None when the checkpoint carries none)."""
