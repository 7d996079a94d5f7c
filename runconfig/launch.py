"""Launch section: how many processes on which hosts, and the Slurm job they run in."""

from typing import Literal

from pydantic import Field

from runconfig.base import Section


class SlurmConfig(Section):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    cpus_per_task: int = Field(2, gt=0)
    mem: str | None = None
    gpus_per_node: int = Field(0, ge=0)
    output_dir: str | None = None  # default: <run.output_dir>/slurm
    signal_grace_s: int = Field(120, gt=0)  # --signal=B:USR1@<grace>: preemption warning before the kill
    requeue: bool = True
    array_concurrency: int = Field(4, gt=0)  # %N cap for data-stage job arrays
    extra_sbatch: list[str] = []


class LaunchConfig(Section):
    launcher: Literal["torchrun", "deepspeed", "slurm"] = "torchrun"
    nodes: int = Field(1, gt=0)
    procs_per_node: int = Field(2, gt=0)
    backend: Literal["gloo", "nccl"] = "gloo"
    master_addr: str = "127.0.0.1"
    master_port: int = Field(29500, gt=0, lt=65536)
    hostfile: str | None = None
    node_rank: int = Field(0, ge=0)
    # Pass-through environment (NCCL_*, GLOO_SOCKET_IFNAME, ...).
    env: dict[str, str] = {}
    slurm: SlurmConfig = SlurmConfig()

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node
