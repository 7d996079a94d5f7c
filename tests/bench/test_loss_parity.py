"""bench/loss_parity.py: every registered family trains in our engine (DeepSpeed ZeRO-2, 2 CPU ranks, accumulation 2)
as in a plain reference loop on the same weights and batches; each sabotage of our side makes the verdict fail.

All of them share one xdist group: they prepare the same cached BBC runs (.cache/bench/prepared), which two workers
must not build at once."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import _common as C  # noqa: E402
from parity_callbacks import SABOTAGES, callbacks_override  # noqa: E402

from pretrain.families import family_names  # noqa: E402

pytestmark = pytest.mark.xdist_group("loss-parity")


def _bench(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "loss_parity.py"), "--no-save", *args],
        cwd=ROOT,
        env=C.child_env(threads=1),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return res, res.stdout + res.stderr


def _verdict(out: str, family: str) -> re.Match:
    m = re.search(
        rf"^VERDICT loss_parity_{family}: ours=(\S+) peer=(\S+) ratio=(\S+) goal=1\.0 (pass|fail)$", out, re.M
    )
    assert m, f"no VERDICT line for {family}:\n{out[-4000:]}"
    return m


@pytest.mark.integration
@pytest.mark.timeout(420)
@pytest.mark.parametrize("family", family_names())
def test_family_trains_in_our_engine_as_in_the_reference_loop(family):
    if not (ROOT / "configs" / f"{family}-tiny.yaml").is_file():
        pytest.skip(f"{family}: no configs/{family}-tiny.yaml preset")
    res, out = _bench("--families", family, "--steps", "6")
    m = _verdict(out, family)
    assert m.group(4) == "pass" and res.returncode == 0, out[-4000:]
    assert float(m.group(1)) <= float(m.group(2))
    _same_grad_norms(out)


def _same_grad_norms(out: str) -> None:
    """The gradient norm our metrics log is the one the plain loop's clip_grad_norm_ returns (not 0, not None)."""
    ours = re.search(r"grad norm \(ours, before clipping at \S+\) (.*?);", out)
    ref = re.search(r"grad norm \(reference\) +(.*)$", out, re.M)
    assert ours and ref, out[-4000:]
    pairs = list(zip(ours.group(1).split(), ref.group(1).split(), strict=True))
    assert pairs and all(math.isclose(float(a), float(b), rel_tol=2e-3) for a, b in pairs), pairs


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_t5_with_adafactor_as_t5_budget_ships_trains_as_in_the_reference_loop():
    """t5-budget trains with Adafactor under ZeRO 0: that path is compared too, and a skipped warmup still fails it."""
    res, out = _bench("--families", "t5", "--optimizers", "adafactor", "--steps", "6")
    m = _verdict(out, "t5_adafactor")
    assert m.group(4) == "pass" and res.returncode == 0, out[-4000:]
    assert "t5_adafactor: adafactor, 6 steps" in out
    _same_grad_norms(out)  # ZeRO 0: DeepSpeed clips but drops the norm; we keep it
    res, out = _bench("--families", "t5", "--optimizers", "adafactor", "--steps", "6", "--sabotage", "warmup")
    m = _verdict(out, "t5_adafactor")
    assert m.group(4) == "fail" and res.returncode == 1, out[-4000:]


@pytest.mark.timeout(60)
def test_the_default_run_adds_the_optimizer_each_budget_preset_ships():
    import loss_parity

    assert loss_parity.shipped_optimizer("t5") == "adafactor"
    assert loss_parity.shipped_optimizer("gpt2") == "adamw"
    assert loss_parity.shipped_optimizer("no-such-family") is None
    assert "optim.name=adafactor" in loss_parity.overrides(6, 2, "adafactor")
    assert "deepspeed.zero_stage=0" in loss_parity.overrides(6, 2, "adafactor")
    assert "deepspeed.zero_stage=2" in loss_parity.overrides(6, 2)


@pytest.mark.integration
@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", SABOTAGES)
def test_each_sabotage_of_our_engine_fails_the_verdict(name):
    """warmup skipped, a micro-batch's gradient lost, the loss summed over ranks, clipping off: each must be seen.
    8 steps: clipping's effect on Adam grows step by step (about 5e-4 after 6 steps against a 1e-4 tolerance)."""
    res, out = _bench("--families", "gpt2", "--steps", "8", "--sabotage", name)
    m = _verdict(out, "gpt2")
    assert m.group(4) == "fail" and res.returncode == 1, out[-4000:]
    assert f"SABOTAGE {name}" in out
    assert float(m.group(3)) > 1.0


@pytest.mark.timeout(30)
def test_an_unknown_sabotage_is_refused_at_load_by_name(tmp_path):
    """The bench's callbacks are an outside plug-in of our run: their settings are checked at load like any."""
    from runconfig import ConfigError, load_config

    good = callbacks_override(tmp_path / "record", "warmup")
    cfg = load_config(ROOT / "configs" / "gpt2-tiny.yaml", [good])
    assert list(cfg.callbacks) == ["bench.parity_callbacks:ParityRecorder", "bench.parity_callbacks:Sabotage"]
    with pytest.raises(ConfigError, match=r"Sabotage\.mode: Input should be 'warmup', 'drop_micro'"):
        load_config(ROOT / "configs" / "gpt2-tiny.yaml", [good.replace('"warmup"', '"no_warmup"')])


@pytest.mark.timeout(60)
def test_a_family_without_a_tiny_preset_is_a_named_skip(tmp_path, monkeypatch, capsys):
    """Families come from the registry, not a list in the bench: one without configs/<family>-tiny.yaml is named."""
    import loss_parity

    monkeypatch.setattr(C, "ROOT", tmp_path)  # no configs/ there: every family lacks its preset
    assert loss_parity.main(["--no-save", "--families", "gpt2", "t5"]) == 0
    out = capsys.readouterr().out
    assert "SKIP gpt2: no configs/gpt2-tiny.yaml preset" in out and "SKIP t5: no configs/t5-tiny.yaml" in out
    assert "0 families run, 2 skipped (gpt2, t5)" in out
