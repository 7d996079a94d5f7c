"""The Ray executor: each task is one Ray task (`num_cpus` each) on a running cluster.

`data.ray.address` is what `ray.init` takes: `auto` (this node belongs to a cluster started with `ray start`),
`host:port` of the head's GCS, or `ray://host:10001` (Ray Client); `local` starts a one-node Ray here. Tasks read and write the run folder, so every
node must see it at the same path (a shared filesystem, as with Slurm). A node that dies mid-task is handled by
Ray (`max_retries` system retries: the task reruns on a live node); a task that raises is resubmitted by us up
to `data.task_retries` times. Outputs are written atomically and are a pure function of the inputs, so a task
that ran twice (once on a node that then died) leaves the same files as a task that ran once.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from core.errors import ConfigError
from data_pipeline.executors.base import Executor, Progress, Stage, register_executor, run_task_guarded

_REPO = str(Path(__file__).resolve().parents[2])


_HINT = "start one with `ray start --head` on the head node, or pass --address local for a one-node Ray here"


def refuse_unreachable(address: str, timeout_s: float = 5.0) -> None:
    """A `host:port` (the head's GCS) or `ray://host:port` (Ray Client) that no process listens on is refused in
    one line naming the key: `ray.init` would otherwise retry it for minutes, printing warnings. One TCP connect;
    `auto` and `local` are left to `ray.init`, which answers at once."""
    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"data.ray.address={address}: expected auto, local, host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ConfigError(f"data.ray.address={address}: nothing answers there ({why}); {_HINT}") from None


def _ray_task(stage: Stage, i: int):
    """Runs on a Ray worker: the task, with the node's address in its marker."""
    import ray

    return run_task_guarded(stage, i, ray.util.get_node_ip_address())


@register_executor("ray")
class RayExecutor(Executor):
    def __init__(self, address: str = "auto", num_cpus: float = 1.0, retries: int = 2, progress: bool = True):
        super().__init__(retries, progress)
        self.address, self.num_cpus = address, num_cpus
        self._remote = None

    @classmethod
    def from_config(cls, cfg) -> RayExecutor:
        r = cfg.data.ray
        refuse_unreachable(
            r.address
        )  # before any stage writes: Ray itself retries a dead address for minutes
        return cls(r.address, r.num_cpus_per_task, cfg.data.task_retries, cfg.data.clean.progress)

    def _connect(self):
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            # Workers import data_pipeline: make this checkout importable there when it is not pip-installed.
            path = os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH", "")) if p)
            try:
                ray.init(
                    address=None if self.address == "local" else self.address,
                    log_to_driver=False,
                    runtime_env={"env_vars": {"PYTHONPATH": path, "DS_ACCELERATOR": "cpu"}},
                )
            except ConnectionError as e:  # `auto` with no `ray start` on this node, or a head that went away
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(
                    f"data.ray.address={self.address}: no Ray cluster ({first}); {_HINT}"
                ) from None
        if self._remote is None:
            self._remote = ray.remote(num_cpus=self.num_cpus, max_retries=max(self.retries, 1))(_ray_task)
        return ray

    def _run(self, stage: Stage, todo: list[int], progress: Progress) -> dict[int, str]:
        ray = self._connect()
        stage_ref = ray.put(stage)
        errors: dict[int, str] = {}
        pending = list(todo)
        for _attempt in range(self.retries + 1):
            if not pending:
                break
            refs = {self._remote.remote(stage_ref, i): i for i in pending}
            errors = {}
            waiting = list(refs)
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=1, timeout=None)
                for ref in ready:
                    i = refs[ref]
                    try:
                        _, _, err = ray.get(ref)
                    except ray.exceptions.RayError as e:  # node or worker died beyond Ray's own retries
                        err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    if err:
                        errors[i] = err
                    else:
                        progress.update()
            pending = sorted(errors)
        return errors

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
