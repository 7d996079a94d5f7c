"""The callback contract (core/callbacks.py, pretrain/run/callback_runner.py): the runner built from the registry and
the config, the most severe action chosen, the states carried through a checkpoint, the config's refusals; and a
test callback's state through a real 2-rank checkpoint and resume, exactly."""

from __future__ import annotations

import shutil

import pytest
import torch

from core.callbacks import CONTINUE, Action, ActionKind, Callback, StepOutcome
from pretrain.run.callback_runner import Callbacks
from runconfig import ConfigError, load_config
from tests.pretrain import steering

BASE = "configs/gpt2-tiny.yaml"
TALLY = f"{steering.MODULE}:StepTally"


class _Says(Callback):
    def __init__(self, name: str, action: Action) -> None:
        super().__init__(None)
        self.key, self.action = name, action

    def on_step_end(self, outcome: StepOutcome) -> Action:
        return self.action


@pytest.mark.timeout(60)
def test_the_runner_carries_the_built_ins_in_order_and_the_named_ones_after():
    cfg = load_config(
        BASE, ["spikes.action=skip", "logging.profile_steps=[2,3]", f"callbacks={{{TALLY}: {{}}}}"]
    )
    cbs = Callbacks.from_config(cfg)
    assert cbs.names() == ["preemption", "watchdog", "spikes", "profiler", "metrics", TALLY]
    assert [c.key for c in cbs.voters] == ["preemption"] and [c.key for c in cbs.judges] == ["spikes"]
    # switched off by their own sections: not built, so a run without them pays nothing
    assert Callbacks.from_config(load_config(BASE)).names() == ["preemption", "watchdog", "metrics"]


@pytest.mark.timeout(60)
def test_the_most_severe_action_wins_and_names_its_callback():
    outcome = StepOutcome(step=4, loss=2.0, ok=True, first_batch_at=0.0)
    says = [
        _Says("a", CONTINUE),
        _Says("b", Action.rollback("b's reason", 2)),
        _Says("c", Action.stop("c's reason", 7)),
        _Says("d", Action.rollback("d's reason")),
    ]
    chosen = Callbacks(says).step_end(outcome)
    assert (chosen.kind, chosen.reason, chosen.exit_code, chosen.by) == (
        ActionKind.STOP,
        "c's reason",
        7,
        "c",
    )
    assert Callbacks(says[:2]).step_end(outcome).by == "b"
    assert Callbacks(says[:1]).step_end(outcome) == CONTINUE


@pytest.mark.timeout(60)
def test_states_round_trip_and_an_older_checkpoint_s_spike_state_still_loads():
    a, b = steering.StepTally(), steering.StepTally()
    a.key = b.key = TALLY
    for step, loss in ((1, 3.5), (2, 3.25)):
        a.on_step_end(StepOutcome(step=step, loss=loss, ok=True, first_batch_at=0.0))
    first = Callbacks([a])
    first.rollbacks = [{"at_step": 2, "to_step": 1, "from_sample": 8, "to_sample": 16}]
    saved = first.state_dict()
    second = Callbacks([b])
    second.load_state_dict(saved, step=2)
    second.start(run=None, progress=type("P", (), {"step": 2})())
    assert second.state_dict() == saved and b.steps == [1, 2] and b.losses == [3.5, 3.25]
    # a checkpoint written before the callbacks carried their own states: its `spikes` entry is the detector's
    legacy = Callbacks([])
    legacy.load_state_dict({"losses": [1.0] * 8, "count": 8, "rollbacks": [{"to_step": 3}]}, step=5)
    assert legacy.saved["spikes"]["count"] == 8 and legacy.rollbacks == [{"to_step": 3}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "callbacks={watchdog: {heartbeat_s: 1}}",
            "callbacks.watchdog: always on; its settings are the `watchdog`",
        ),
        ("callbacks={preemption: {}}", "callbacks.preemption: always on and takes no settings"),
        # the registered names: the built-ins (and any module.path:Name callback this process used before)
        ("callbacks={nope: {}}", "unknown callback 'nope' (registered: [.*'metrics', 'preemption', 'probe'"),
        (f"callbacks={{{TALLY}: {{every: 2}}}}", f"callbacks.{TALLY}: callback '{TALLY}' takes no options"),
        (
            "callbacks={core.callbacks:Action: {}}",
            "callbacks.core.callbacks:Action: .* is not a Callback class",
        ),
    ],
)
def test_bad_callbacks_are_refused_at_load_naming_the_key(override, said):
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config(BASE, [override])


def _tally(ckpts, tag: str) -> dict:
    state = torch.load(ckpts / tag / "mp_rank_00_model_states.pt", weights_only=False)
    return state["spikes"]["callbacks"][TALLY]


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(400)
def test_a_callback_s_state_round_trips_through_a_checkpoint_exactly(tmp_path):
    """2 gloo ranks, real DeepSpeed (the smoke run: 6 steps, checkpoints at 3 and 6). The step-6 checkpoint's tally
    of a run resumed from step 3 is the uninterrupted run's, exactly: the same steps, the same agreed losses."""
    from tests.pretrain.conftest import torchrun
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

    config, out = prepare_smoke_run(tmp_path)
    on = f'callbacks={{"{TALLY}": {{}}}}'
    torchrun(config, [on], timeout=200)
    ckpts = out / "checkpoints"
    through = _tally(ckpts, "step00000006")
    assert through["steps"] == [1, 2, 3, 4, 5, 6] and _tally(ckpts, "step00000003")["steps"] == [1, 2, 3]
    shutil.rmtree(ckpts / "step00000006")
    (ckpts / "latest").write_text("step00000003")
    torchrun(config, [on], timeout=200)
    assert _tally(ckpts, "step00000006") == through
