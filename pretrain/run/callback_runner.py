"""The run's callbacks, in one object the loop calls: built from the registry (the built-ins in pyproject.toml's
order, then the config's `callbacks:` in its order), each hook fanned out, the most severe action carried out.

The loop knows no callback by name. What an action needs from the rest of the run is done here with the
checkpoint functions the loop uses (a rollback reloads the last complete checkpoint exactly as a resume would,
keeping the loader where it is), and every decision comes from figures all ranks agreed (core/callbacks.py), so
every rank takes it alike without a collective of its own; the one collective a rollback adds (rank 0 naming the
checkpoint) happens only when every rank rolls back.
"""

from __future__ import annotations

from typing import Any

from core.callbacks import CONTINUE, Action, ActionKind, Callback, StepOutcome
from core.errors import CannotContinueError
from core.exit_codes import CANNOT_CONTINUE
from core.log import get_logger
from core.registry import CALLBACKS, builtin_entry_points
from pretrain.checkpoint.meta import TAG_RE
from runconfig.callbacks import callback_class, callback_settings

log = get_logger(__name__)


class CallbackStop(CannotContinueError):
    """A callback stopped the run (its action STOP, or a rollback past its limit): exit with its code."""

    def __init__(self, message: str, exit_code: int | None) -> None:
        super().__init__(message)
        self.exit_code = CANNOT_CONTINUE if exit_code is None else exit_code


def _section(cfg: Any, path: str | None) -> Any:
    """A built-in's settings: the run config's section at `path` (`eval`, `logging`), or the whole config."""
    value = cfg
    for part in path.split(".") if path else ():
        value = getattr(value, part)
    return value


def _overrides(cb: Callback, hook: str) -> bool:
    return getattr(type(cb), hook) is not getattr(Callback, hook)


def build(cfg: Any) -> list[Callback]:
    """The built-ins that are always on (with their section of the config), then the callbacks the config names
    under `callbacks:` in its order."""
    out: list[Callback] = []
    for ep in builtin_entry_points().get(CALLBACKS.group, ()):
        cls = callback_class(ep.name)
        if cls.section is not None or cls.always:  # else on when the config names it, as an outside one
            out.append(_named(cls(_section(cfg, cls.section)), ep.name))
    for name, settings in cfg.callbacks.items():
        out.append(_named(callback_class(name)(callback_settings(name, settings)), name))
    return out


def _named(cb: Callback, key: str) -> Callback:
    cb.key = key  # the name it was registered under: its state is saved under it
    return cb


class Callbacks:
    """The enabled callbacks and the hook lists the step reads (only those that implement a hook are called)."""

    def __init__(self, items: list[Callback]) -> None:
        self.items = [cb for cb in items if cb.enabled()]
        self.voters = [cb for cb in self.items if cb.votes]
        self.judges = [cb for cb in self.items if cb.judges]
        self.batch_hooks = [cb for cb in self.items if _overrides(cb, "on_batch")]
        self.forward_hooks = [cb for cb in self.items if _overrides(cb, "on_forward")]
        self.rollbacks: list[dict[str, int]] = []  # every rollback so far (carried in checkpoints)
        self.saved: dict[str, Any] = {}  # a resumed checkpoint's states, handed over at start

    @classmethod
    def from_config(cls, cfg: Any) -> Callbacks:
        return cls(build(cfg))

    def names(self) -> list[str]:
        return [_key(cb) for cb in self.items]

    # --- set-up and end
    def start(self, run: Any, progress: Any) -> dict[str, Any]:
        """Each callback's start (with its resumed state first); the figures some measure at this step (the
        random-init ones), in one eval row."""
        row: dict[str, Any] = {}
        for cb in self.items:
            cb.load_state_dict(self.saved.get(_key(cb)), progress.step)
            row.update(cb.on_start(run, progress) or {})
        return row

    def end(self, run: Any, progress: Any) -> None:
        for cb in self.items:
            cb.on_end(run, progress)

    # --- the step
    def step_begin(self, step: int) -> None:
        for cb in self.items:
            cb.on_step_begin(step)

    def step_end(self, outcome: StepOutcome) -> Action:
        """Every callback sees the agreed step; the most severe action is returned (the first of equals)."""
        chosen = CONTINUE
        for cb in self.items:
            action = cb.on_step_end(outcome)
            if action.kind > chosen.kind:
                chosen = Action(
                    action.kind, action.reason, action.exit_code, action.max_repeats, action.limit, _key(cb)
                )
        return chosen

    # --- logging and evaluation
    def metrics(self, step: int, loader_wait_s: float) -> dict[str, float]:
        row: dict[str, float] = {}
        for cb in self.items:
            row.update(cb.metrics(step, loader_wait_s))
        return row

    def log(self, step: int, row: dict[str, Any], prefix: str = "train") -> None:
        for cb in self.items:
            cb.on_log(step, row, prefix)

    def evaluate(self, run: Any, step: int) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for cb in self.items:
            row.update(cb.on_eval(run, step))
        return row

    def saved_at(self, step: int) -> None:
        for cb in self.items:
            cb.on_save(step)

    # --- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Name -> state of each callback that has one, and the rollbacks so far."""
        states = {_key(cb): cb.state_dict() for cb in self.items}
        return {
            "rollbacks": list(self.rollbacks),
            "callbacks": {k: v for k, v in states.items() if v is not None},
        }

    def load_state_dict(self, state: dict[str, Any] | None, step: int) -> None:
        """A resumed checkpoint's states, handed to each callback at `start`. A checkpoint written before the
        callbacks carried their own states holds the spike detector's alone here."""
        if not state:
            return
        if "callbacks" not in state:
            state = {"rollbacks": state.get("rollbacks", []), "callbacks": {"spikes": state}}
        self.rollbacks = [dict(r) for r in state.get("rollbacks", [])]
        self.saved = dict(state["callbacks"])

    # --- actions
    def act(self, run: Any, progress: Any, action: Action) -> bool:
        """Carry out a STOP (raises CallbackStop after the last save completes) or a ROLLBACK (True when the run
        rolled back: `progress` is the checkpoint's). REQUEUE and CONTINUE are the loop's."""
        if action.kind == ActionKind.STOP:
            run.checkpoints.wait()  # the last good step's save completes before the run stops (every rank stops)
            raise CallbackStop(action.reason, action.exit_code)
        if action.kind != ActionKind.ROLLBACK:
            return False
        return self._roll_back(run, progress, action)

    def _roll_back(self, run: Any, progress: Any, action: Action) -> bool:
        import torch.distributed as dist

        rank = dist.get_rank()
        tag = run.checkpoints.last_complete()  # after the save in flight; every rank the one rank 0 names
        if tag is None:
            log.warning(
                f"[{action.by}] step {progress.step}: no complete checkpoint to roll back to; the step "
                "was skipped"
            )
            for cb in self.items:
                cb.on_restore(None, -1, None)
            return False
        check_rollback_budget(action, self.rollbacks, tag)
        state = run.checkpoints.reload(tag)  # the schedule as configured (and its clock) is kept
        record = {
            "at_step": progress.step,
            "to_step": int(state["step"]),
            "from_sample": int(state["loader"]["consumed_samples"]),
            "to_sample": int(run.train_loader.state_dict()["consumed_samples"]),
        }
        self.rollbacks.append(record)
        saved = _saved_states(state)
        for cb in self.items:
            cb.on_restore(saved.get(_key(cb)), record["to_step"], record)
        log.warning(
            f"[{action.by}] rank {rank}: rolled back from step {record['at_step']} to {tag}; samples "
            f"{record['from_sample']}..{record['to_sample']} are skipped"
        )
        progress.step, progress.tokens_seen = state["step"], state["tokens_seen"]
        progress.last_loss = state.get("loss", progress.last_loss)
        progress.bad_steps = 0  # the checkpoint's weights gave finite losses
        return True


def check_rollback_budget(action: Action, records: list[dict[str, int]], tag: str) -> None:
    """Stop (the action's exit code) instead of a rollback to a checkpoint already rolled back to `max_repeats`
    times: without a newer checkpoint in between, the same trigger came back after each reload, and a step-counted
    run would reload it for ever. The records are the same on every rank, so is the decision."""
    match = TAG_RE.match(tag)
    to_step = int(match.group(1)) if match else -1
    done = sum(1 for r in records if r["to_step"] == to_step)
    if action.max_repeats is not None and done >= action.max_repeats:
        raise CallbackStop(
            f"{action.reason} after {done} rollbacks to {tag} ({action.limit or action.by}): the run does not get "
            "past it from that checkpoint; lower optim.lr or change the data, then resume (the checkpoint is kept)",
            action.exit_code,
        )


def _key(cb: Callback) -> str:
    return cb.key or cb.name or type(cb).__name__


def _saved_states(client_state: dict[str, Any]) -> dict[str, Any]:
    """The callbacks' states a checkpoint carries (their legacy place: the `spikes` entry)."""
    entry = client_state.get("spikes") or {}
    return entry.get("callbacks", {"spikes": entry} if entry else {})
