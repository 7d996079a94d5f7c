"""The loss-spike detector on sequences of step losses (fast tier: real tensors, no process group), and its
config refused at load naming the key. The two-rank runs are in tests/pretrain/test_spikes_ranks.py."""

from __future__ import annotations

import math

import pytest
import torch

from core.callbacks import Action
from core.exit_codes import CANNOT_CONTINUE, LOSS_SPIKE, PREEMPTED
from pretrain.run.callback_runner import CallbackStop, check_rollback_budget
from pretrain.run.spikes import LossSpikeStop, SpikeDetector
from runconfig import ConfigError, load_config

pytestmark = pytest.mark.timeout(60)

BASE = "configs/gpt2-tiny.yaml"


def _detector(action: str = "skip", window: int = 8, sigma: float = 3.0, **more) -> SpikeDetector:
    overrides = [f"spikes.action={action}", f"spikes.window={window}", f"spikes.sigma={sigma}"]
    overrides += [f"spikes.{k}={v}" for k, v in more.items()]
    cfg = load_config(BASE, ["schedule.total_steps=100", "checkpoint.every_steps=10", *overrides])
    return SpikeDetector(cfg, torch.device("cpu"), rank=0, per_step=4)


def _judge(det: SpikeDetector, loss: float, n_bad: int = 0) -> bool:
    """One step: the agreed sum over 4 micro-batch losses, as StepSync hands it over."""
    flag = det.judge(
        torch.tensor(loss * 4, dtype=torch.float64), torch.tensor(float(n_bad), dtype=torch.float64)
    )
    assert flag.dtype == torch.float64 and flag.shape == ()
    return bool(flag)


def _noisy(n: int, start: float = 5.0) -> list[float]:
    """A falling loss with noise, as a run logs it."""
    g = torch.Generator().manual_seed(0)
    return [start - 0.01 * i + 0.02 * float(torch.randn((), generator=g)) for i in range(n)]


def test_a_spike_is_flagged_only_once_half_the_window_is_filled():
    det = _detector(window=8)
    # the first three steps are not judged, however far apart they are
    assert [_judge(det, x) for x in (5.0, 50.0, 5.0)] == [False, False, False]
    det = _detector(window=8)
    assert not any(_judge(det, x) for x in _noisy(4))
    assert _judge(det, 50.0)  # judged from the fifth step on


def test_a_falling_noisy_loss_is_never_flagged_and_a_jump_is():
    det = _detector(window=16, sigma=6.0)
    assert not any(_judge(det, x) for x in _noisy(200))
    assert _judge(det, 10.0)
    assert not _judge(det, 3.0)  # the next normal step goes on as before


def test_the_band_is_mean_plus_sigma_deviations_of_the_kept_window():
    det = _detector(window=8, sigma=2.0)
    window = [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]
    for x in window:
        _judge(det, x)
    t = torch.tensor(window, dtype=torch.float64)
    band = float(t.mean() + 2.0 * t.std())
    assert not _judge(det, band - 1e-6)
    # the value just below the band joined the window (it replaced the oldest); the band moved with it
    t = torch.tensor([*window[1:], band - 1e-6], dtype=torch.float64)
    assert _judge(det, float(t.mean() + 2.0 * t.std()) + 1e-6)


def test_spiking_and_non_finite_losses_stay_out_of_the_window():
    det = _detector(window=8, sigma=3.0)
    for x in _noisy(8):
        _judge(det, x)
    before = det.losses.clone(), int(det.count)
    assert _judge(det, 100.0)
    assert not _judge(det, math.inf) and not _judge(det, math.nan)
    assert not _judge(det, 5.0, n_bad=1)  # a step with a non-finite micro-batch: StepGuard's, not ours
    assert torch.equal(det.losses, before[0]) and int(det.count) == before[1]
    assert _judge(det, 100.0)  # the first spike did not widen the band


def test_none_judges_nothing():
    det = _detector(action="none")
    assert not any(_judge(det, x) for x in [*_noisy(20), 1e6])
    assert det.metrics() == {}


def test_actions_and_counts_on_the_host():
    det = _detector(action="skip", max_consecutive=3)
    assert det.handle(1, False, 5.0) is False
    assert det.handle(2, True, 50.0) is False and det.handle(3, False, 5.0) is False
    assert det.metrics() == {"spikes": 1, "spikes_skipped": 1, "spike_rollbacks": 0}
    det.handle(4, True, 50.0)
    det.handle(5, True, 50.0)
    with pytest.raises(LossSpikeStop, match="3 loss spikes in a row at step 6"):
        det.handle(6, True, 50.0)
    assert _detector(action="rollback").handle(7, True, 50.0) is True
    with pytest.raises(
        LossSpikeStop, match=r"loss spike at step 7 \(loss 50.0000; spikes.action stop\)"
    ) as e:
        _detector(action="stop").handle(7, True, 50.0)
    assert e.value.exit_code == LOSS_SPIKE and LOSS_SPIKE not in (CANNOT_CONTINUE, PREEMPTED, 0, 1, 2)


def test_a_non_finite_step_rolls_back_only_under_rollback():
    """Issue 64 item 1: under `rollback`, a non-finite loss was left to the 20-bad-steps halt on the weights that
    gave it; it rolls back like a spike. The other actions keep StepGuard's skip and the halt."""
    assert _detector(action="rollback").handle(7, False, float("nan"), finite=False) is True
    for action in ("skip", "stop", "none"):
        assert _detector(action=action).handle(7, False, float("nan"), finite=False) is False


def test_rollbacks_to_one_checkpoint_are_bounded_by_max_rollbacks():
    """The same checkpoint reloaded spikes.max_rollbacks times stops the run (LOSS_SPIKE) before the next reload;
    a newer checkpoint starts the count again."""
    records = [{"at_step": 11, "to_step": 9, "from_sample": 72, "to_sample": 88}] * 2
    action = Action.rollback("loss spike at step 11", 2, LOSS_SPIKE, "spikes.max_rollbacks")
    check_rollback_budget(action, records, "step00000012")  # a newer checkpoint: its own count, 0
    with pytest.raises(
        CallbackStop, match=r"at step 11 after 2 rollbacks to step00000009 \(spikes.max_rollbacks\)"
    ) as stopped:
        check_rollback_budget(action, records, "step00000009")
    assert stopped.value.exit_code == LOSS_SPIKE


def test_state_round_trip_resumes_the_same_decisions():
    a = _detector(window=8, sigma=3.0)
    losses = _noisy(13)
    for x in losses[:11]:
        _judge(a, x)
    a.handle(11, True, 9.0)
    b = _detector(window=8, sigma=3.0)
    b.load_state_dict(a.state_dict(), step=11)
    assert b.state_dict() == a.state_dict() and b.step == 11
    for x in [*losses[11:], 7.0, 5.0]:
        assert _judge(a, x) == _judge(b, x)
    assert torch.equal(a.losses, b.losses)
    c = _detector(window=16)  # another window: starts afresh, counters too
    c.load_state_dict(a.state_dict(), step=11)
    assert int(c.count) == 0 and c.spikes == 0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("spikes.sigma=0", "spikes.sigma"),
        ("spikes.sigma=-1", "spikes.sigma"),
        ("spikes.window=4", "spikes.window"),
        ("spikes.max_consecutive=0", "spikes.max_consecutive"),
    ],
)
def test_bad_values_are_refused_at_load_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(BASE, ["spikes.action=skip", override])


def test_rollback_without_checkpoints_during_the_run_is_refused():
    with pytest.raises(
        ConfigError, match=r"spikes\.action: 'rollback' needs checkpoints.*checkpoint\.every_steps"
    ):
        load_config(BASE, ["spikes.action=rollback", "schedule.total_steps=50", "checkpoint.every_steps=50"])
    cfg = load_config(
        BASE, ["spikes.action=rollback", "schedule.total_steps=50", "checkpoint.every_steps=10"]
    )
    assert cfg.spikes.action == "rollback" and cfg.spikes.window == 128 and cfg.spikes.sigma == 6.0
