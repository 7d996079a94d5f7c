"""Two simulated hosts: network namespaces joined by a veth pair, addresses that exist only inside them.

Names carry a per-process prefix so cleanup only ever touches what this test session created.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

PREFIX = f"lmt{os.getpid() % 100000}"
IFACE = "lmt0"  # the veth end is renamed to this inside each namespace, so one GLOO_SOCKET_IFNAME fits both


def missing_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2); run `sudo launch/ci_setup.sh`"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class TwoHosts:
    def __init__(self, subnet: str = "10.200.0"):
        self.names = [f"{PREFIX}a", f"{PREFIX}b"]
        self.addrs = [f"{subnet}.1", f"{subnet}.2"]

    def __enter__(self) -> TwoHosts:
        self.cleanup()
        try:
            a, b = self.names
            for ns in self.names:
                _ip("netns", "add", ns)
            _ip("link", "add", f"{PREFIX}va", "type", "veth", "peer", "name", f"{PREFIX}vb")
            for ns, end, addr in ((a, f"{PREFIX}va", self.addrs[0]), (b, f"{PREFIX}vb", self.addrs[1])):
                _ip("link", "set", end, "netns", ns)
                _ip("-n", ns, "link", "set", end, "name", IFACE)
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
                _ip("-n", ns, "link", "set", IFACE, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def popen(self, host: int, argv: list[str], env: dict[str, str], log, cwd: str) -> subprocess.Popen:
        """Start argv inside host's namespace, in its own process group (so it can be killed as a host)."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.names[host], *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )

    def kill_host(self, host: int) -> None:
        """Every process in the namespace dies at once, like a node losing power."""
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stacks(self, host: int) -> str:
        """py-spy dumps of every Python process on host (what a hung survivor is waiting in), or why not."""
        spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if spy is None:
            return "(no py-spy: pip install py-spy for the survivor's stacks)"
        out = []
        for pid in self.pids(host):
            res = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            out.append(f"--- pid {pid}\n{res.stdout}{res.stderr}")
        return "\n".join(out)

    def pids(self, host: int) -> list[int]:
        out = _ip("netns", "pids", self.names[host], check=False).stdout
        return [int(p) for p in out.split()]

    def cleanup(self) -> None:
        for i, ns in enumerate(self.names):
            if ns in _ip("netns", "list", check=False).stdout.split():
                self.kill_host(i)
                time.sleep(0.2)
                _ip("netns", "del", ns, check=False)
        _ip("link", "del", f"{PREFIX}va", check=False)
