"""Launch section: how many processes on which hosts, and the Slurm job they run in."""

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from runconfig.base import Section

# Slurm's memory syntax: a whole number with an optional K/M/G/T unit (megabytes without one).
_MEM = re.compile(r"^\d+[KMGT]?$")


class SlurmConfig(Section):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    # CPUs for the one task (torchrun) per node. Default: cpus_per_rank x launch.procs_per_node.
    cpus_per_task: int | None = Field(None, gt=0)
    # Default: 1 + loader.num_workers (the rank itself and its DataLoader workers).
    cpus_per_rank: int | None = Field(None, gt=0)
    # Memory of the training job, in Slurm's syntax (e.g. 480G): per node (`--mem`) or per GPU (`--mem-per-gpu`),
    # at most one of them. Neither: `--mem=0`, all of each node's memory (a GPU job takes whole nodes); set one
    # of them where jobs share nodes.
    mem: str | None = None
    mem_per_gpu: str | None = None
    # GPUs per node. Default (null): launch.procs_per_node with backend nccl, none with gloo; 0 = request none.
    gpus_per_node: int | None = Field(None, ge=0)
    # How GPUs are requested, because sites differ: `--gpus-per-node=N` or `--gres=gpu:N`.
    gpu_request: Literal["gpus-per-node", "gres"] = "gpus-per-node"
    gpu_type: str | None = None  # e.g. a100 -> --gpus-per-node=a100:8 / --gres=gpu:a100:8
    nodelist: str | None = None
    exclude: str | None = None
    constraint: str | None = None  # training job only
    output_dir: str | None = None  # default: <run.output_dir>/slurm
    signal_grace_s: int = Field(120, gt=0)  # --signal=B:USR1@<grace>: preemption warning before the kill
    requeue: bool = True
    # A job that keeps getting preempted (or keeps failing after the signal) stops requeueing itself after this.
    max_requeues: int = Field(20, ge=0)
    # srun --wait: once one node's torchrun exits, the others get this long (to finish a checkpoint) before
    # Slurm kills them, so a dead node ends the step instead of leaving survivors blocked.
    step_wait_s: int = Field(60, gt=0)
    # Data-stage jobs (clean/tokenize arrays, dedup + tokenizer, manifest) need no GPU: their own resources.
    # data_partition default: `partition` when training requests no GPUs, else the cluster's default partition
    # (never the GPU partition by accident).
    data_partition: str | None = None
    data_constraint: str | None = None
    array_concurrency: int = Field(4, gt=0)  # %N cap for data-stage job arrays
    data_time: str | None = None  # time limit of data-stage tasks (default: time)
    # CPUs per data-stage task (default: data.clean.workers)
    data_cpus_per_task: int | None = Field(None, gt=0)
    data_mem: str | None = None  # memory per data-stage task (default: the cluster's default)
    extra_sbatch: list[str] = []  # raw '#SBATCH' options for every job, e.g. ["--reservation=x"]
    extra_sbatch_train: list[
        str
    ] = []  # raw '#SBATCH' options for the training job only, e.g. ["--exclusive"]

    @field_validator("mem", "mem_per_gpu", "data_mem")
    @classmethod
    def _mem_syntax(cls, v: str | None, info) -> str | None:
        if v is not None and not _MEM.match(str(v)):
            raise ValueError(
                f"launch.slurm.{info.field_name}: {v!r} is not a Slurm memory size (e.g. 64G, 512000M)"
            )
        return v

    @model_validator(mode="after")
    def _one_mem(self) -> "SlurmConfig":
        if self.mem is not None and self.mem_per_gpu is not None:
            raise ValueError(
                "launch.slurm.mem and launch.slurm.mem_per_gpu: set at most one (per node or per GPU)"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        """array_time/array_cpus_per_task/array_mem were renamed data_*: say so instead of 'extra field'."""
        if isinstance(data, dict):
            old = sorted(k for k in data if k in ("array_time", "array_cpus_per_task", "array_mem"))
            if old:
                raise ValueError(
                    "launch.slurm: " + ", ".join(f"{k} is now {k.replace('array_', 'data_')}" for k in old)
                )
        return data


class LaunchConfig(Section):
    launcher: Literal["torchrun", "deepspeed", "slurm"] = "torchrun"
    nodes: int = Field(1, gt=0)
    procs_per_node: int = Field(2, gt=0)  # ranks per node (= GPUs per node on GPU machines)
    backend: Literal["gloo", "nccl"] = "gloo"
    master_addr: str = "127.0.0.1"
    # torchrun/DeepSpeed rendezvous port. Unset (null), each launch picks one: a world of one (plain `python -m
    # pretrain train`) and the local pipeline take a free port, Slurm jobs 20000 + job id % 20000 (two jobs sharing
    # a node never collide), and the rest torchrun's 29500. Null rather than a default of 29500, so a run's
    # resolved config, which names every field, still means "pick one" when a run is started from it.
    master_port: int | None = Field(None, gt=0, lt=65536)
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
    # Every ssh (--all-nodes, pdsh, our reachability check) runs with BatchMode=yes and this ConnectTimeout: an
    # unreachable host or a password prompt fails within it, naming the host, instead of hanging.
    ssh_connect_timeout_s: int = Field(10, gt=0)
    python: str | None = None  # interpreter on the nodes (default: the one running `python -m launch`)
    workdir: str | None = None  # folder the job starts in (default: the current one)
    setup: list[
        str
    ] = []  # shell lines run first on every node / in the batch script (module load, venv, ...)
    # Pass-through environment (NCCL_*, GLOO_SOCKET_IFNAME, ...).
    env: dict[str, str] = {}
    slurm: SlurmConfig = SlurmConfig()

    @model_validator(mode="after")
    def _ranks(self) -> "LaunchConfig":
        if self.node_rank >= self.nodes:
            raise ValueError(f"launch.node_rank ({self.node_rank}) must be < launch.nodes ({self.nodes})")
        gpus = self.gpus_per_node
        if gpus and self.procs_per_node > gpus:
            raise ValueError(
                f"launch.procs_per_node ({self.procs_per_node}) exceeds launch.slurm.gpus_per_node ({gpus}): "
                "one rank per GPU"
            )
        return self

    @property
    def gpus_per_node(self) -> int:
        """GPUs the training job requests per node: explicit, else one per rank with nccl, none with gloo."""
        if self.slurm.gpus_per_node is not None:
            return self.slurm.gpus_per_node
        return self.procs_per_node if self.backend == "nccl" else 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def rendezvous_port(self) -> int:
        """The port a launch across processes meets on: the named one, else torchrun's default."""
        return 29500 if self.master_port is None else self.master_port
