"""Run config -> the exact command line each node runs, for torchrun, the DeepSpeed launcher and Slurm.

Rendering is pure (no process is started here) so `--dry-run` prints precisely what `run` executes, and the
tests check the same strings the cluster sees.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import LmstackError
from core.log import get_logger
from runconfig import RunConfig

log = get_logger(__name__)

# torchrun passes SIGTERM to its workers but waits only this long (default 30 s) before SIGKILL; the trainer
# needs the preemption grace to finish its step and write the checkpoint.
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


LOOPBACK = ("127.0.0.1", "localhost", "::1")


# A hostfile host: an RFC 1123 name (labels of letters, digits and '-', '_' too as clusters use it; no label
# begins or ends with '-') or an IP address. Nothing else reaches ssh or pdsh: a host beginning with '-' is read by
# ssh as an option (`-oProxyCommand=...` runs a local command), and a shell character could end up in pdsh's list.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOST_NAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")


def is_host(host: str) -> bool:
    """A host name or IP address that ssh, pdsh and torchrun take as one (never as an option)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return len(host) <= 253 and HOST_NAME_RE.fullmatch(host) is not None


class LaunchError(LmstackError, ValueError):
    """The launch section cannot describe a runnable job (message names the key to fix)."""


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 and ::1: an address that means 'this machine' on every node."""
    h = host.strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost") or h.startswith("localhost."):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def ssh_options(cfg: RunConfig) -> list[str]:
    """Never prompt, never wait on an unreachable host longer than launch.ssh_connect_timeout_s."""
    return ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={cfg.launch.ssh_connect_timeout_s}"]


def ssh_argv(cfg: RunConfig, host: str, remote: str) -> list[str]:
    """`ssh OPTIONS -- HOST REMOTE`: `--` ends ssh's options, so no host is ever read as one (beside the check
    of every hostfile host at load, `parse_hostfile`)."""
    return ["ssh", *ssh_options(cfg), "--", host, remote]


def unreachable_hosts(cfg: RunConfig, hosts: list[str]) -> list[tuple[str, str]]:
    """ssh to every host at once (`true`); [(host, ssh's last message)] for those that fail. Bounded by the
    connect timeout (plus a little for the remote shell), so a dead host is named instead of waited on."""
    wait = cfg.launch.ssh_connect_timeout_s + 20
    procs = [
        (
            h,
            subprocess.Popen(
                ssh_argv(cfg, h, "true"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for h in hosts
    ]
    bad = []
    for h, p in procs:
        try:
            _, err = p.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            bad.append((h, f"no answer within {wait} s"))
            continue
        if p.returncode != 0:
            bad.append((h, (err.strip().splitlines() or [f"ssh exited {p.returncode}"])[-1]))
    return bad


def wait_for_master(cfg: RunConfig, master: str) -> None:
    """A node other than the first waits for the master's rendezvous port, at most deepspeed.comm_timeout_s,
    and names it when it never answers (torchrun's own message is a 40-frame C++ trace)."""
    import socket
    import time

    port, wait = cfg.launch.rendezvous_port, cfg.deepspeed.comm_timeout_s
    deadline = time.monotonic() + wait
    last = ""
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((master, port), timeout=max(0.1, min(left, 5.0))):
                pass
            return check_master_is_a_store(master, port)
        except OSError as e:
            last = e.strerror or str(e)
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"launch.master_addr: the master {master}:{port} (launch.master_addr / launch.master_port, or the "
                f"hostfile's first host) did not answer within deepspeed.comm_timeout_s={wait} s ({last}); start "
                "node 0 first or fix the address"
            )
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


# A real store answers a client in milliseconds once its port accepts; another service never does.
STORE_CHECK_TIMEOUT_S = 15


def check_master_is_a_store(master: str, port: int) -> None:
    """A port that answers TCP may be another service (a web server, a stale job's port). torchrun would then
    retry with 40-frame C++ traces until deepspeed.comm_timeout_s; a TCPStore client in a child process (its
    C++ output captured) gets the first wrong answer and we say it in one line. The client's connection is
    the same one every rank makes; a real store carries on."""
    code = (
        "import sys, datetime, torch.distributed as d; "
        "d.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, "
        "timeout=datetime.timedelta(seconds=float(sys.argv[3])))"
    )
    argv = [sys.executable, "-c", code, master, str(port), str(STORE_CHECK_TIMEOUT_S)]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=STORE_CHECK_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        why = f"no store reply within {STORE_CHECK_TIMEOUT_S} s"
    else:
        if res.returncode == 0:
            return
        lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
        hits = [ln for ln in lines if "Ping failed" in ln or "invalid value" in ln or "Error" in ln]
        why = (hits or lines or [f"exit {res.returncode}"])[-1][:300]
    raise LaunchError(
        f"launch.master_addr: the master {master}:{port} answers, but not as a torch rendezvous store ({why}); "
        "another service holds launch.master_port there: fix the port or the address"
    )


def check_hosts_reachable(cfg: RunConfig, hosts: list[str]) -> None:
    bad = unreachable_hosts(cfg, hosts)
    if bad:
        raise LaunchError(
            f"launch.hostfile: unreachable over ssh (BatchMode=yes, ConnectTimeout="
            f"{cfg.launch.ssh_connect_timeout_s} s, launch.ssh_connect_timeout_s): "
            + "; ".join(f"{h}: {why}" for h, why in bad)
        )


@dataclass
class Entry:
    """What every rank runs: `python -m <module> <args>` (default: the trainer)."""

    module: str = "pretrain"
    args: list[str] = field(default_factory=list)

    @classmethod
    def train(cls, config_path: str | os.PathLike[str], overrides: list[str] | None = None) -> Entry:
        return cls("pretrain", ["train", "--config", str(Path(config_path).resolve()), *(overrides or [])])


@dataclass
class NodeCommand:
    """One node's launch: run `argv` with `env` added, on `host`."""

    node_rank: int
    host: str
    argv: list[str]
    env: dict[str, str]

    def shell(self) -> str:
        """A copy-pasteable shell line (environment first)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (f"env {env} " if env else "") + shlex.join(self.argv)


def python_exe(cfg: RunConfig) -> str:
    return cfg.launch.python or sys.executable


def workdir(cfg: RunConfig) -> str:
    return str(Path(cfg.launch.workdir or os.getcwd()).resolve())


def parse_hostfile(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """DeepSpeed hostfile format: `hostname slots=N` per line, `#` comments. Returns [(host, slots)]."""
    p = Path(path)
    if not p.is_file():
        raise LaunchError(f"launch.hostfile: file not found: {p}")
    hosts: list[tuple[str, int]] = []
    for n, raw in enumerate(p.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for extra in parts[1:]:
            key, _, val = extra.partition("=")
            if key != "slots" or not val.isdigit() or int(val) < 1:
                raise LaunchError(f"{p}:{n}: expected 'hostname slots=N', got {raw!r}")
            slots = int(val)
        if not is_host(parts[0]):
            raise LaunchError(
                f"{p}:{n}: host {parts[0]!r} is not a host name or IP address"
                + (" (ssh would read it as an option)" if parts[0].startswith("-") else "")
                + "; list each node by its name or address (docs/security.md)"
            )
        if any(h == parts[0] for h, _ in hosts):
            raise LaunchError(f"{p}:{n}: host {parts[0]!r} listed twice")
        hosts.append((parts[0], slots))
    if not hosts:
        raise LaunchError(f"launch.hostfile: {p} lists no hosts")
    return hosts


def resolve_hosts(cfg: RunConfig) -> tuple[list[str], str]:
    """Hosts (one per node) and the master address, checked against launch.nodes / procs_per_node."""
    lc = cfg.launch
    if not lc.hostfile:
        if lc.nodes > 1 and lc.launcher == "deepspeed":
            raise LaunchError("launch.hostfile: the deepspeed launcher needs a hostfile for launch.nodes > 1")
        if lc.nodes > 1 and lc.master_addr in LOOPBACK:
            where = "launch.hostfile (its first host is the master) or launch.master_addr (the first node's address)"
            if "master_addr" not in lc.model_fields_set:
                raise LaunchError(
                    f"launch.master_addr: launch.nodes={lc.nodes} without a hostfile would rendezvous at "
                    f"{lc.master_addr}, which the other nodes cannot reach; set {where}"
                )
            log.warning(
                f"[launch] warning: launch.master_addr={lc.master_addr} with launch.nodes={lc.nodes}: only ranks on "
                f"this machine can reach it (fine for a one-box rehearsal); for real nodes set {where}"
            )
        return [lc.master_addr if i == 0 else f"node{i}" for i in range(lc.nodes)], lc.master_addr
    entries = parse_hostfile(lc.hostfile)
    if len(entries) != lc.nodes:
        raise LaunchError(
            f"launch.nodes ({lc.nodes}) does not match the {len(entries)} hosts in {lc.hostfile}; "
            f"set launch.nodes={len(entries)}"
        )
    bad = [h for h, s in entries if s != lc.procs_per_node]
    if bad:
        raise LaunchError(
            f"launch.procs_per_node ({lc.procs_per_node}) differs from slots= of {bad} in {lc.hostfile}"
        )
    hosts = [h for h, _ in entries]
    loop = [h for h in hosts if is_loopback(h)]
    if lc.nodes > 1 and loop:
        raise LaunchError(
            f"launch.hostfile: {lc.hostfile} names the loopback host(s) {', '.join(repr(h) for h in loop)} for a "
            f"{lc.nodes}-node job: on the other nodes that address is themselves (the master would be unreachable "
            "and two nodes would claim one rank); list each node by a name or address the others can reach"
        )
    master = hosts[0] if lc.master_addr in LOOPBACK and lc.nodes > 1 else lc.master_addr
    return hosts, master


def base_env(cfg: RunConfig) -> dict[str, str]:
    """Environment every rank gets: the YAML's pass-through plus what makes preemption and logs behave."""
    env = {"PYTHONUNBUFFERED": "1", SHUTDOWN_TIMEOUT_ENV: str(cfg.launch.slurm.signal_grace_s)}
    env.update(cfg.launch.env)
    return env


def torchrun_args(
    cfg: RunConfig,
    node_rank: int | str,
    master_addr: str,
    local_addr: str | None = None,
    master_port: int | str | None = None,
) -> list[str]:
    """torchrun options for one node. node_rank, master_addr and master_port may be shell references like
    "$SLURM_NODEID" (a Slurm job derives its port from the job id on the node)."""
    lc = cfg.launch
    port = str(lc.rendezvous_port if master_port is None else master_port)
    args = [
        "--nnodes",
        str(lc.nodes),
        "--nproc_per_node",
        str(lc.procs_per_node),
        "--max_restarts",
        str(lc.max_restarts),
    ]
    # The rendezvous waits deepspeed.comm_timeout_s for the other nodes / the master, not torchrun's 600 s.
    wait = cfg.deepspeed.comm_timeout_s
    if lc.rdzv == "static" or lc.nodes == 1:
        args += ["--node_rank", str(node_rank), "--master_addr", master_addr, "--master_port", port]
        args += ["--rdzv_conf", f"timeout={wait}"]
    else:
        # c10d: the store runs on the master; each agent must know whether it is that host, and which of its
        # addresses peers can reach (on hosts with several interfaces the default guess is often wrong).
        is_host = 1 if str(node_rank) == "0" else 0
        args += [
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"{master_addr}:{port}",
            "--rdzv_id",
            cfg.run.name,
            "--rdzv_conf",
            f"is_host={is_host},join_timeout={wait}",
        ]
    if local_addr or lc.local_addr:
        args += ["--local_addr", local_addr or lc.local_addr or ""]
    return args


def node_commands(cfg: RunConfig, entry: Entry) -> list[NodeCommand]:
    """What runs on every node for launcher torchrun or deepspeed (Slurm: see launch.slurm)."""
    lc = cfg.launch
    py = python_exe(cfg)
    env = base_env(cfg)
    hosts, master = resolve_hosts(cfg)
    if lc.launcher == "torchrun":
        out = []
        for rank, host in enumerate(hosts):
            argv = [
                py,
                "-m",
                "launch.torchrun",  # torchrun, exiting with the ranks' own code (launch/torchrun.py)
                *torchrun_args(cfg, rank, master),
                "-m",
                entry.module,
                *entry.args,
            ]
            out.append(NodeCommand(rank, host, argv, dict(env)))
        return out
    if lc.launcher == "deepspeed":
        # One command on the first host; the DeepSpeed launcher reaches the others over pdsh/ssh/MPI itself.
        argv = [
            py,
            "-m",
            "deepspeed.launcher.runner",
            "--num_nodes",
            str(lc.nodes),
            "--num_gpus",
            str(lc.procs_per_node),
        ]
        argv += ["--master_addr", master, "--master_port", str(lc.rendezvous_port)]
        if lc.hostfile:
            argv += ["--hostfile", str(Path(lc.hostfile).resolve()), "--launcher", lc.multinode_runner]
            if lc.nodes > 1:
                # DeepSpeed's own check (`ssh -o PasswordAuthentication=no host hostname`) has no timeout and
                # hung on a dead host: `launch run` checks every host itself (check_hosts_reachable), and pdsh's
                # ssh gets the same BatchMode / ConnectTimeout.
                argv += ["--no_ssh_check"]
                env["PDSH_SSH_ARGS_APPEND"] = " ".join(ssh_options(cfg))
        else:
            # No hostfile: the launcher would read /job/hostfile if present; /dev/null means "this node only".
            argv += ["--hostfile", "/dev/null"]
        # --no_local_rank: our entry points read LOCAL_RANK from the environment, not a --local_rank argument.
        argv += ["--no_local_rank", "--module", entry.module, *entry.args]
        if lc.nodes > 1:
            # Remote ranks only get PYTHON*/NCCL*-style variables and the DS_ENV_FILE lines: put ours there.
            env["DS_ENV_FILE"] = str(deepspeed_env_file(cfg))
        return [NodeCommand(0, hosts[0], argv, env)]
    raise LaunchError(
        f"launch.launcher: '{lc.launcher}' is rendered as an sbatch script (python -m launch sbatch)"
    )


def deepspeed_env_file(cfg: RunConfig) -> Path:
    """Where the pass-through environment for remote DeepSpeed ranks is written (DS_ENV_FILE, absolute)."""
    return (Path(cfg.run.root) / "launch" / "deepspeed_env").resolve()  # local (the staging folder of a URL)


def write_deepspeed_env(cfg: RunConfig) -> Path:
    path = deepspeed_env_file(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in sorted(base_env(cfg).items())))
    return path


def ssh_command(cmd: NodeCommand, cfg: RunConfig) -> list[str]:
    """Run one node's command on its host over ssh (torchrun per node without a scheduler)."""
    remote = " && ".join([f"cd {shlex.quote(workdir(cfg))}", *cfg.launch.setup, "exec " + cmd.shell()])
    return ssh_argv(cfg, cmd.host, remote)
