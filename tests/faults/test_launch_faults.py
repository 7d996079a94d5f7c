"""Issue 25 rows 4, 5, 6 and 9 / item 5: launches that cannot hang. ssh carries BatchMode and ConnectTimeout,
unreachable hosts and masters are named within the configured timeout, a multi-node hostfile that names
loopback is refused, and `launch run` exits 75 only when a checkpoint was written at the signal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.net import free_port
from launch import render
from launch.__main__ import main
from launch.render import Entry, LaunchError
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "roberta-tiny.yaml"
# Addresses that route nowhere from a test box: a TCP connect to them waits for the kernel's SYN retries.
UNREACHABLE = ("10.255.255.1", "10.255.255.2")


def cfg_with(tmp_path, *overrides):
    return load_config(TINY, [f"run.output_dir={tmp_path}/run", *overrides])


def entry():
    return Entry.train(TINY, ["schedule.total_steps=20"])


def _hostfile(tmp_path, hosts, slots=1) -> Path:
    hf = tmp_path / "hosts"
    hf.write_text("".join(f"{h} slots={slots}\n" for h in hosts))
    return hf


def test_ssh_lines_carry_batchmode_and_a_configurable_connect_timeout(tmp_path):
    hf = _hostfile(tmp_path, ["gpu-a", "gpu-b"])
    base = [f"launch.hostfile={hf}", "launch.nodes=2", "launch.procs_per_node=1"]
    cmds = render.node_commands(cfg_with(tmp_path, *base), entry())
    ssh = render.ssh_command(cmds[1], cfg_with(tmp_path, *base))
    assert ssh[:7] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", "gpu-b"]
    cfg = cfg_with(tmp_path, *base, "launch.ssh_connect_timeout_s=3")
    assert "ConnectTimeout=3" in render.ssh_command(cmds[1], cfg)
    # The deepspeed launcher's pdsh gets the same options; its own ssh check (no timeout) is replaced by ours.
    (ds,) = render.node_commands(
        cfg_with(tmp_path, *base, "launch.launcher=deepspeed", "launch.ssh_connect_timeout_s=3"), entry()
    )
    assert ds.env["PDSH_SSH_ARGS_APPEND"] == "-o BatchMode=yes -o ConnectTimeout=3"
    assert "--no_ssh_check" in ds.argv


@pytest.mark.parametrize("loopback", ["localhost", "127.0.0.1", "127.0.1.1", "::1"])
@pytest.mark.parametrize("first", [True, False])
def test_multinode_hostfile_naming_loopback_is_refused(tmp_path, capsys, loopback, first):
    hosts = [loopback, "node-b"] if first else ["node-a", loopback]
    hf = _hostfile(tmp_path, hosts)
    rc = main(
        [
            "run",
            "--config",
            str(TINY),
            "--dry-run",
            f"run.output_dir={tmp_path}/r",
            f"launch.hostfile={hf}",
            "launch.nodes=2",
            "launch.procs_per_node=1",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"{hf}" in err and repr(loopback) in err and "loopback" in err
    # One node: a loopback hostfile is fine.
    _hostfile(tmp_path, ["localhost"])
    assert (
        main(
            [
                "run",
                "--config",
                str(TINY),
                "--dry-run",
                f"run.output_dir={tmp_path}/r",
                f"launch.hostfile={hf}",
                "launch.nodes=1",
                "launch.procs_per_node=1",
            ]
        )
        == 0
    )


def _run_launch(tmp_path, flags, *overrides, timeout=120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "run",
            *flags,
            "--config",
            str(TINY),
            f"run.output_dir={tmp_path}/r",
            *overrides,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return res, time.monotonic() - t0


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_unreachable_hosts_are_named_within_the_connect_timeout(tmp_path, launcher):
    hf = _hostfile(tmp_path, UNREACHABLE)
    args = [
        f"launch.hostfile={hf}",
        "launch.nodes=2",
        "launch.procs_per_node=1",
        f"launch.launcher={launcher}",
        "launch.ssh_connect_timeout_s=2",
    ]
    res, took = _run_launch(tmp_path, ["--all-nodes"] if launcher == "torchrun" else [], *args, timeout=90)
    assert res.returncode not in (0, 75), res.stderr[-2000:]
    assert took < 45, took
    assert UNREACHABLE[0] in res.stderr and "unreachable" in res.stderr, res.stderr[-2000:]


def _run_second_node(tmp_path, port: int, comm_timeout_s: int) -> tuple[subprocess.CompletedProcess, float]:
    """`launch run --node-rank 1` of a 2-node torchrun job whose master is 127.0.0.1:<port>."""
    return _run_launch(
        tmp_path,
        ["--node-rank", "1"],
        "launch.nodes=2",
        "launch.procs_per_node=1",
        "launch.master_addr=127.0.0.1",
        f"launch.master_port={port}",
        f"deepspeed.comm_timeout_s={comm_timeout_s}",
        timeout=150,
    )


def test_unreachable_master_is_named_within_comm_timeout(tmp_path):
    """Node 1 of 2 whose master never answers: torchrun's rendezvous waits deepspeed.comm_timeout_s, not 600 s."""
    port = free_port()  # nothing listens there
    res, took = _run_second_node(tmp_path, port, comm_timeout_s=5)
    assert res.returncode not in (0, 75), res.stderr[-2000:]
    assert took < 60, took
    assert f"the master 127.0.0.1:{port}" in res.stderr and "deepspeed.comm_timeout_s=5" in res.stderr, (
        res.stderr[-3000:]
    )


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_master_that_is_not_a_torch_store_is_named_at_once(tmp_path):
    """Node 1 of 2 whose master address answers TCP with another service (a web server, an old job's port): the
    first wrong answer says so in one line, instead of torchrun retrying with C++ traces until comm_timeout_s."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_like_a_web_server() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(64)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    threading.Thread(target=answer_like_a_web_server, daemon=True).start()
    try:
        res, took = _run_second_node(tmp_path, port, comm_timeout_s=600)
    finally:
        server.close()
    assert res.returncode == 2, res.stderr[-2000:]
    assert took < 60, took
    assert f"the master 127.0.0.1:{port} answers, but not as a torch rendezvous store" in res.stderr, (
        res.stderr
    )
    assert "Traceback" not in res.stderr and "frame #" not in res.stderr, res.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_real_store_passes_the_master_check(tmp_path):
    """The check connects to a real TCPStore as a client and leaves it working."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    cfg = cfg_with(
        tmp_path,
        "launch.nodes=2",
        "launch.procs_per_node=1",
        "launch.master_addr=127.0.0.1",
        f"launch.master_port={store.port}",
        "deepspeed.comm_timeout_s=30",
    )
    render.wait_for_master(cfg, "127.0.0.1")
    store.set("after", "ok")
    assert store.get("after") == b"ok"


def test_rendezvous_timeout_rendered_from_comm_timeout(tmp_path):
    cfg = cfg_with(
        tmp_path,
        "launch.nodes=2",
        "launch.procs_per_node=1",
        "launch.master_addr=10.0.0.1",
        "deepspeed.comm_timeout_s=42",
    )
    a = render.node_commands(cfg, entry())[1].argv
    assert a[a.index("--rdzv_conf") + 1] == "timeout=42"
    cfg = cfg_with(
        tmp_path,
        "launch.nodes=2",
        "launch.procs_per_node=1",
        "launch.master_addr=10.0.0.1",
        "launch.rdzv=c10d",
        "deepspeed.comm_timeout_s=42",
    )
    a = render.node_commands(cfg, entry())[1].argv
    assert a[a.index("--rdzv_conf") + 1] == "is_host=0,join_timeout=42"


with_signal = pytest.mark.parametrize("write_checkpoint,expected", [(False, "not75"), (True, 75)])
SUPERVISE = r"""
import json, os, signal, subprocess, sys, threading
from pathlib import Path
from core.process import supervise as _supervise
ckpt, write = Path(sys.argv[1]), sys.argv[2] == "1"
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time, pathlib\n"
    "def stop(*a):\n"
    "    if sys.argv[2] == '1':\n"
    "        d = pathlib.Path(sys.argv[1]) / 'step00000007'; d.mkdir(parents=True); (d / 'COMPLETE').write_text('{}')\n"
    "        sys.exit(75)\n"
    "    sys.exit(1)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n", str(ckpt), sys.argv[2]], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
sys.exit(_supervise([child], checkpoint_dir=ckpt))
"""


@with_signal
def test_exit_75_only_when_a_checkpoint_was_written_at_the_signal(tmp_path, write_checkpoint, expected):
    """Ctrl-C (or a preemption) that ends the ranks before they checkpoint is not 'requeue me'."""
    ckpt = tmp_path / "ckpt"
    old = ckpt / "step00000005"
    old.mkdir(parents=True)
    (old / "COMPLETE").write_text("{}")  # an earlier checkpoint does not count
    res = subprocess.run(
        [sys.executable, "-c", SUPERVISE, str(ckpt), "1" if write_checkpoint else "0"],
        cwd=ROOT,
        timeout=60,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if expected == 75:
        assert res.returncode == 75, res.stderr
    else:
        assert res.returncode not in (0, 75), res.stderr
        assert "no checkpoint was written" in res.stderr


def test_launch_error_for_hostfile_is_a_launch_error(tmp_path):
    hf = _hostfile(tmp_path, ["localhost", "b"])
    with pytest.raises(LaunchError):
        render.resolve_hosts(
            cfg_with(tmp_path, f"launch.hostfile={hf}", "launch.nodes=2", "launch.procs_per_node=1")
        )


def test_a_hostfile_host_is_never_passed_to_ssh_as_an_option(tmp_path):
    """Issue 64 item 8: a hostfile line `-oProxyCommand=touch${IFS}$T/PWNED slots=2` ran that command locally
    in `launch run --all-nodes`'s reachability check (ssh read the host as an option). It is refused at load,
    one line naming the hostfile, the line and the host; nothing runs."""
    marker = tmp_path / "PWNED"
    host = f"-oProxyCommand=touch${{IFS}}{tmp_path}/PWNED"
    hf = tmp_path / "hosts"
    hf.write_text(f"{host} slots=2\nnode-b slots=2\n")
    args = [
        f"launch.hostfile={hf}",
        "launch.nodes=2",
        "launch.procs_per_node=2",
        "launch.ssh_connect_timeout_s=2",
    ]
    res, _ = _run_launch(tmp_path, ["--all-nodes"], *args, timeout=90)
    assert not marker.exists(), "the hostfile's host ran as an ssh option"
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert f"{hf}:1" in line and repr(host) in line and "Traceback" not in res.stderr, res.stderr[-2000:]


@pytest.mark.parametrize(
    "host", ["-oProxyCommand=true", "gpu;rm", "gpu$(id)", "-", "a..b", "x" * 64, "[::1]", "user@gpu"]
)
def test_a_hostfile_host_that_is_no_host_name_or_address_is_refused(tmp_path, host):
    hf = tmp_path / "hosts"
    hf.write_text(f"node-a slots=1\n{host} slots=1\n")
    with pytest.raises(LaunchError, match=f"{hf}:2: ") as e:
        render.parse_hostfile(hf)
    assert repr(host.split()[0]) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "host", ["gpu-a", "node_01", "gpu-a.cluster.example.org", "10.0.0.7", "fe80::1", "h"]
)
def test_host_names_and_addresses_are_accepted(tmp_path, host):
    hf = tmp_path / "hosts"
    hf.write_text(f"{host} slots=1\n")
    assert render.parse_hostfile(hf) == [(host, 1)]


def test_every_ssh_line_ends_its_options_before_the_host(tmp_path):
    """Beside the check at load: ssh is told where its options end, so no host (from a hostfile, a master
    address or a future caller) is ever read as one."""
    marker = tmp_path / "PWNED"
    cfg = cfg_with(tmp_path, "launch.ssh_connect_timeout_s=2")
    bad = render.unreachable_hosts(cfg, [f"-oProxyCommand=touch {marker}"])
    assert not marker.exists() and len(bad) == 1
    hf = _hostfile(tmp_path, ["gpu-a", "gpu-b"])
    base = [f"launch.hostfile={hf}", "launch.nodes=2", "launch.procs_per_node=1"]
    cmds = render.node_commands(cfg_with(tmp_path, *base), entry())
    ssh = render.ssh_command(cmds[1], cfg_with(tmp_path, *base))
    assert ssh[5:7] == ["--", "gpu-b"]
