"""A real two-node Slurm (Debian's slurmctld/slurmd + munge) started on this machine in a temp folder.

Not a mock: sbatch/srun/scontrol talk to a real controller, and two slurmd daemons (n1, n2) on distinct ports
play two nodes. Everything (munge socket, state, spool, logs) lives under the temp folder, so stopping the
daemons and deleting the folder leaves the machine as it was.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from datetime import datetime
from pathlib import Path

from core.net import free_port

BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "munged")


def missing_reason() -> str | None:
    """Why a local Slurm cannot be started here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root to run slurmd/munged (run launch/ci_setup.sh as root in CI)"
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"missing {', '.join(absent)}: run `sudo launch/ci_setup.sh`"
    if not Path("/etc/munge/munge.key").is_file():
        return "no /etc/munge/munge.key: run `sudo launch/ci_setup.sh`"
    return None


class LocalSlurm:
    """Start/stop a 2-node cluster; helpers to wait for job states."""

    def __init__(
        self, root: Path, nodes: tuple[str, ...] = ("n1", "n2"), cpus: int | None = None, gpus: int = 0
    ):
        """cpus/gpus: declare nodes bigger than this machine (config_overrides; GPUs as count-only GRES) so that
        the controller can judge GPU job scripts, e.g. with `sbatch --test-only`; nothing runs on them."""
        self.root = Path(root)
        self.nodes = nodes
        self.cpus, self.gpus = cpus, gpus
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> LocalSlurm:
        for sub in ("munge", "state", "spool", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        shutil.chown(self.root / "munge", "munge", "munge")
        os.chmod(self.root / "munge", 0o755)  # munged insists the socket folder is world-executable
        os.chmod(self.root, 0o755)
        self._start_munge()
        self._write_conf()
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        for n in self.nodes:
            self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", n], f"slurmd-{n}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if all(states.get(n, "").startswith("idle") for n in self.nodes):
                return self
            time.sleep(0.5)
        logs = "\n".join(p.read_text()[-2000:] for p in (self.root / "log").glob("*.log"))
        self.stop()
        raise RuntimeError(f"local Slurm nodes did not become idle in {timeout}s; logs:\n{logs}")

    def stop(self) -> None:
        # Cancel leftovers first so slurmd kills their processes, then stop the daemons we started.
        if self.conf.exists():
            self.run(["scancel", "--full", "--user", "root"], check=False)
            time.sleep(0.5)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()

    def _start_munge(self) -> None:
        d = self.root / "munge"
        cmd = [
            "runuser",
            "-u",
            "munge",
            "--",
            "munged",
            "--foreground",
            f"--socket={self.munge_socket}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
        ]
        self._spawn(cmd, "munged", log_dir=d)
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(d / 'munged.out').read_text()[-2000:]}")
            time.sleep(0.1)

    def _spawn(self, cmd: list[str], name: str, log_dir: Path | None = None) -> None:
        log = open((log_dir or self.root / "log") / f"{name}.out", "ab")  # noqa: SIM115 - lives as long as the daemon
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env))

    def _write_conf(self) -> None:
        r, host, cpus = self.root, socket.gethostname().split(".")[0], self.cpus or os.cpu_count() or 2
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        lines = [
            "ClusterName=lmtest",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=1",
            "MinJobAge=600",
            "KillWait=10",
            "InactiveLimit=0",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=defer_batch=0",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        if self.cpus or self.gpus:
            lines.append("SlurmdParameters=config_overrides")
        if self.gpus:
            lines.append("GresTypes=gpu")
            # slurmd drops file-less GPUs: give each fake GPU a device file of its own (a link to /dev/null).
            lines_gres = []
            for n in self.nodes:
                dev = r / "dev" / n
                dev.mkdir(parents=True, exist_ok=True)
                for i in range(self.gpus):
                    (dev / f"gpu{i}").symlink_to("/dev/null")
                lines_gres.append(f"NodeName={n} Name=gpu File={dev}/gpu[0-{self.gpus - 1}]\n")
            (r / "gres.conf").write_text("".join(lines_gres))
        for n in self.nodes:
            lines.append(
                f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus}{gres} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n")

    # -- helpers -----------------------------------------------------------------------------------------
    def run(self, cmd: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def job_fields(self, job_id: str) -> dict[str, str]:
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0])) if out.strip() else {}

    def array_states(self, job_id: str) -> dict[str, str]:
        """Task id -> state for every task of an array job."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False).stdout
        states = {}
        for line in out.splitlines():
            f = dict(re.findall(r"(\w+)=(\S*)", line))
            if "ArrayTaskId" in f:
                states[f["ArrayTaskId"]] = f["JobState"]
        return states

    def wait_state(self, job_id: str, states: set[str], timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        f: dict[str, str] = {}
        while time.monotonic() < deadline:
            f = self.job_fields(job_id)
            if f.get("JobState") in states:
                return f
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} not in {states} after {timeout}s: {f}")

    def release_requeued(self, job_id: str, fields: dict[str, str]) -> None:
        """Start a requeued job now instead of after Slurm's hold (its BeginTime), once that is safe.

        Slurm holds a requeued job back because slurmd revoked the old instance's credential and refuses any
        credential of that job id created in the same second or before (`cred->ctime <= revoked`): a job released
        in the second of its requeue fails at launch (FAILED, ExitCode 1:0, RunTime 0, nothing in its log; CI at
        4898a06). So it is released only once its requeue (SubmitTime) is a few seconds old."""
        requeued = datetime.fromisoformat(fields["SubmitTime"]).timestamp()  # local time, as Slurm prints it
        if time.time() >= requeued + 3:
            self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)

    def log_tail(self, lines: int = 40) -> str:
        """The controller's and the nodes' logs, last lines of each (what a failed job's own log cannot say)."""
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)
