"""Issue 66: `pretrain plan`'s own flags are checked like config keys: `--world-size 3` (a batch it cannot divide)
and `--gpu a10` (no such entry) gave tracebacks, and `--mfu 1.5` printed a plan "at MFU 150%". Each is one
`error:` line naming the flag and the values it takes, before any work."""

from __future__ import annotations

import pytest

from core.exit_codes import USAGE
from tests.faults.test_plan_checks import _plan, _tokens


@pytest.mark.parametrize(
    "flag, needles",
    [
        (["--world-size", "3"], ["--world-size 3", "global_batch_size (32)", "1, 2, 4"]),
        (["--world-size", "0"], ["--world-size 0", "at least 1"]),
        (["--gpu", "a10"], ["--gpu: unknown GPU 'a10'", "a10g", "h100"]),
        (["--mfu", "1.5"], ["--mfu 1.5", "(0, 1]"]),
        (["--mfu", "0"], ["--mfu 0", "(0, 1]"]),
    ],
)
def test_a_bad_plan_flag_is_one_line_naming_it_and_its_valid_values(tmp_path, capsys, flag, needles):
    _tokens(tmp_path / "run")
    rc, out, err = _plan(capsys, f"run.output_dir={tmp_path}/run", *flag)
    lines = err.strip().splitlines()
    assert rc == USAGE and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and not out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_good_flags_still_plan(tmp_path, capsys):
    _tokens(tmp_path / "run")
    rc, out, err = _plan(
        capsys, f"run.output_dir={tmp_path}/run", "--world-size", "4", "--gpu", "A10G", "--mfu", "1"
    )
    assert rc == 0 and "MFU 100%" in out, err
