"""One task model, several schedulers: a stage is "N tasks, task i does this" (`Stage`); an executor only
decides where and when task i runs. Executors are registered by name (`data.executor`): `local` (a process
pool on this machine) and `ray` (a Ray cluster); Slurm job arrays render the same tasks as `python -m
data_pipeline task ...` lines (launch/slurm.py). Every executor skips tasks whose completion marker exists,
retries a failed task `data.task_retries` times, shows a progress bar (or a periodic line) per stage and
raises `StageFailed` naming every task that still failed.
"""

from core.registry import EXECUTORS
from data_pipeline.executors import ray_executor  # noqa: F401  (registration; imports ray only when used)
from data_pipeline.executors.base import (
    Executor,
    Stage,
    StageFailed,
    StageResult,
    build_executor,
    register_executor,
    run_stages,
)
from data_pipeline.executors.local import LocalExecutor

__all__ = [
    "EXECUTORS",
    "Executor",
    "LocalExecutor",
    "Stage",
    "StageFailed",
    "StageResult",
    "build_executor",
    "register_executor",
    "run_stages",
]
