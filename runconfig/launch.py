"""Launch section: how many processes on which hosts, and the Slurm job they run in."""

from typing import Literal

from pydantic import Field, model_validator

from runconfig.base import Section


class SlurmConfig(Section):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    cpus_per_task: int = Field(2, gt=0)  # CPUs for the one task (torchrun) per node
    mem: str | None = None
    gpus_per_node: int = Field(0, ge=0)
    nodelist: str | None = None
    exclude: str | None = None
    constraint: str | None = None
    output_dir: str | None = None  # default: <run.output_dir>/slurm
    signal_grace_s: int = Field(120, gt=0)  # --signal=B:USR1@<grace>: preemption warning before the kill
    requeue: bool = True
    # A job that keeps getting preempted (or keeps failing after the signal) stops requeueing itself after this.
    max_requeues: int = Field(20, ge=0)
    # srun --wait: once one node's torchrun exits, the others get this long (to finish a checkpoint) before
    # Slurm kills them, so a dead node ends the step instead of leaving survivors blocked.
    step_wait_s: int = Field(60, gt=0)
    array_concurrency: int = Field(4, gt=0)  # %N cap for data-stage job arrays
    array_time: str | None = None  # time limit of data-stage array tasks (default: time)
    array_cpus_per_task: int | None = None  # CPUs per data-stage task (default: cpus_per_task)
    array_mem: str | None = None  # memory per data-stage task (default: mem)
    extra_sbatch: list[str] = []  # raw '#SBATCH' options, e.g. ["--exclusive", "--reservation=x"]


class LaunchConfig(Section):
    launcher: Literal["torchrun", "deepspeed", "slurm"] = "torchrun"
    nodes: int = Field(1, gt=0)
    procs_per_node: int = Field(2, gt=0)  # ranks per node (= GPUs per node on GPU machines)
    backend: Literal["gloo", "nccl"] = "gloo"
    master_addr: str = "127.0.0.1"
    master_port: int = Field(29500, gt=0, lt=65536)
    # Several nodes: a DeepSpeed-style hostfile (`host slots=N` per line); its first host is the master.
    hostfile: str | None = None
    node_rank: int = Field(0, ge=0)
    # torchrun rendezvous across nodes: static (master_addr/port + node_rank) or c10d (endpoint master_addr:port,
    # node ranks assigned at rendezvous; needs local_addr where hosts see each other on a non-default interface).
    rdzv: Literal["static", "c10d"] = "static"
    local_addr: str | None = None
    max_restarts: int = Field(0, ge=0)  # torchrun in-place restarts; we prefer relaunch + resume (see README)
    # deepspeed launcher over several hosts: how it reaches them.
    multinode_runner: Literal["pdsh", "openmpi", "mvapich", "slurm"] = "pdsh"
    python: str | None = None  # interpreter on the nodes (default: the one running `python -m launch`)
    workdir: str | None = None  # folder the job starts in (default: the current one)
    setup: list[str] = []  # shell lines run first on every node / in the batch script (module load, venv, ...)
    # Pass-through environment (NCCL_*, GLOO_SOCKET_IFNAME, ...).
    env: dict[str, str] = {}
    slurm: SlurmConfig = SlurmConfig()

    @model_validator(mode="after")
    def _ranks(self) -> "LaunchConfig":
        if self.node_rank >= self.nodes:
            raise ValueError(f"launch.node_rank ({self.node_rank}) must be < launch.nodes ({self.nodes})")
        gpus = self.slurm.gpus_per_node
        if gpus and self.procs_per_node > gpus:
            raise ValueError(
                f"launch.procs_per_node ({self.procs_per_node}) exceeds launch.slurm.gpus_per_node ({gpus}): "
                "one rank per GPU"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node
