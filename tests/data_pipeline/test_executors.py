"""The task model and the local executor: markers, skip of finished tasks, bounded retries, failures named,
progress lines, stats merged from markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_pipeline.executors import LocalExecutor, Stage, StageFailed, build_executor
from runconfig import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs/roberta-tiny.yaml"


def _flaky(i: int, *, folder: str, fail_times: dict[int, int]) -> dict:
    """Fails task i its first fail_times[i] attempts (attempts counted in files: works across processes)."""
    count = Path(folder) / f"attempts-{i}"
    n = int(count.read_text()) if count.exists() else 0
    count.write_text(str(n + 1))
    if n < fail_times.get(i, 0):
        raise OSError(f"input {i} not readable (attempt {n + 1})")
    return {"i": i, "square": i * i}


def _stage(tmp_path: Path, n: int, fail_times: dict[int, int]) -> Stage:
    return Stage(
        "demo",
        _flaky,
        n,
        tmp_path / "markers",
        kwargs={"folder": str(tmp_path), "fail_times": fail_times},
        labels=tuple(f"input-{i}" for i in range(n)),
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_retries_then_success_and_skip_on_rerun(tmp_path, workers, capsys):
    stage = _stage(tmp_path, 5, {1: 2, 3: 1})
    res = LocalExecutor(workers=workers, retries=2, progress=True).run(stage)
    assert (res.ran, res.skipped) == (5, 0)
    assert sorted(s["square"] for s in stage.task_stats()) == [0, 1, 4, 9, 16]
    assert (tmp_path / "attempts-1").read_text() == "3"  # two failures, one success
    assert "[demo] 5/5 tasks" in capsys.readouterr().err  # the periodic line (stderr is not a terminal)
    again = LocalExecutor(workers=workers, retries=2).run(stage)
    assert (again.ran, again.skipped) == (0, 5)


def test_exhausted_retries_name_the_task(tmp_path):
    stage = _stage(tmp_path, 4, {2: 99})
    with pytest.raises(
        StageFailed,
        match=r"1 of 4 task\(s\) failed after retries: demo\[2\] \(input-2\): "
        r"OSError: input 2 not readable \(attempt 3\)",
    ):
        LocalExecutor(workers=2, retries=2, progress=False).run(stage)
    assert [stage.is_done(i) for i in range(4)] == [True, True, False, True]


def test_executor_from_config(tmp_path):
    cfg = load_config(
        str(CONFIG), [f"run.output_dir={tmp_path}", "data.task_retries=5", "data.clean.workers=3"]
    )
    ex = build_executor(cfg)
    assert isinstance(ex, LocalExecutor) and (ex.workers, ex.retries) == (3, 5)
    with pytest.raises(Exception, match="data.executor"):
        load_config(str(CONFIG), ["data.executor=spark"])
