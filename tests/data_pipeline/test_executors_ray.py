"""The Ray executor on a real two-node Ray cluster: `ray start --head` and `ray start --address` in two network
namespaces (two hosts joined by a veth pair). The worker node is killed mid-stage; the stage completes on the
head node and the deduplicated corpus is identical to a local run's."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from data_pipeline.clean import run_clean
from data_pipeline.dedup import run_dedup
from data_pipeline.dedup.stages import build_stages
from data_pipeline.shards import iter_corpus
from runconfig import load_config
from tests.data_pipeline.test_dedup_sharded import make_corpus, write_config
from tests.launch.netns_hosts import TwoHosts, missing_reason

pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.ray, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"
PORT = 6391


N_SHARDS = 64


def _env(tmp: str) -> dict[str, str]:
    # Ray's token authentication, with a token of this test only (never the user's ~/.ray/auth_token).
    return {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        # A dead node is declared dead after ~3 missed health checks of 0.5 s instead of ~30 s.
        "RAY_health_check_period_ms": "500",
        "RAY_health_check_timeout_ms": "500",
        "RAY_health_check_failure_threshold": "3",
        "TMPDIR": tmp,
    }


@pytest.fixture
def hosts():
    reason = missing_reason()
    if reason:
        pytest.skip(f"network namespaces unavailable: {reason}")
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("ray is not installed (pip install -e '.[test]')")
    with TwoHosts(subnet="10.201.0") as h:
        yield h


def _where(cfg, stage: str) -> list[str]:
    return list(_where_by_task(cfg, stage).values())


def _where_by_task(cfg, stage: str) -> dict[str, str]:
    """Each finished task's marker name -> the node that wrote it."""
    marks = Path(build_stages(cfg)[0].marker_dir)
    return {p.name: json.loads(p.read_text())["where"] for p in sorted(marks.glob(f"{stage}-*.done"))}


def test_two_node_ray_cluster_survives_worker_node_death(hosts, tmp_path):
    # Under load (CI beside a second pytest worker) the head finished all of 24 tiny shards before the joining
    # node's first task was done, leaving nothing to lose when the node died.
    src = make_corpus(tmp_path, n_files=N_SHARDS, n_orig=400)
    # 896 permutations (8x the default) make each signature task ~50 ms rather than ~16 ms (real shards take
    # seconds): the head must not finish the stage before the joining node's first task is done.
    cfg_path = write_config(tmp_path, src, partitions=2, minhash={"bands": 112, "rows": 8})
    cfg = load_config(str(cfg_path))
    run_clean(cfg)
    ref = load_config(str(cfg_path), [f"run.output_dir={tmp_path / 'ref'}"])
    run_clean(ref)
    run_dedup(ref)  # the local process pool's answer

    # short: Ray's unix socket paths are length-limited
    ray_tmp = tempfile.mkdtemp(prefix="lmray", dir="/tmp")
    env = _env(ray_tmp)
    head, worker = hosts.addrs
    logs = [open(tmp_path / f"ray-{n}.log", "wb") for n in ("head", "worker", "driver")]
    try:
        common = [
            "--num-cpus",
            "1",
            "--object-store-memory",
            str(80 << 20),
            "--disable-usage-stats",
            "--block",
        ]
        hosts.popen(
            0,
            [
                str(RAY),
                "start",
                "--head",
                "--node-ip-address",
                head,
                "--port",
                str(PORT),
                "--include-dashboard=false",
                "--temp-dir",
                ray_tmp,
                *common,
            ],
            env,
            logs[0],
            str(ROOT),
        )
        time.sleep(3)
        worker_proc = hosts.popen(
            1,
            [str(RAY), "start", "--address", f"{head}:{PORT}", "--node-ip-address", worker, *common],
            env,
            logs[1],
            str(ROOT),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # both nodes registered
            st = subprocess.run(
                ["ip", "netns", "exec", hosts.names[0], str(RAY), "status", "--address", f"{head}:{PORT}"],
                env=env,
                capture_output=True,
                text=True,
            )
            if st.stdout.count("node_") >= 2 or worker_proc.poll() is not None:
                break
            time.sleep(1)
        assert st.stdout.count("node_") >= 2, (
            st.stdout + st.stderr + (tmp_path / "ray-worker.log").read_text()
        )

        driver = hosts.popen(
            0,
            [
                sys.executable,
                "-m",
                "data_pipeline",
                "dedup",
                "--config",
                str(cfg_path),
                "data.executor=ray",
                f"data.ray.address={head}:{PORT}",
            ],
            env,
            logs[2],
            str(ROOT),
        )
        deadline = time.monotonic() + 120
        while (
            worker not in _where(cfg, "dedup-signatures")
            and driver.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        hosts.kill_host(1)  # the worker node loses power mid-stage
        t_kill = time.monotonic()
        # read after the kill: the dead node writes nothing more
        before = _where_by_task(cfg, "dedup-signatures")
        rc = driver.wait(timeout=150)
        elapsed = time.monotonic() - t_kill
    finally:
        hosts.kill_host(1)
        hosts.kill_host(0)
        for f in logs:
            f.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out = (tmp_path / "ray-driver.log").read_text()
    assert rc == 0, out[-4000:] + (tmp_path / "ray-head.log").read_text()[-2000:]
    # the worker had done work, the stage was not over
    done_by_worker = {t for t, node in before.items() if node == worker}
    assert done_by_worker and len(before) < N_SHARDS, before
    after = _where_by_task(cfg, "dedup-signatures")
    assert len(after) == N_SHARDS
    # The rest ran on the head. A task the worker finished (its marker written) but could not report before it
    # died is run again on the head (Ray retries it; same output): it counts as the head's, not as the worker's
    # (CI, session 17: 2 markers before the kill, 1 after). The dead node wrote nothing after the kill.
    assert {t for t, node in after.items() if node == worker} <= done_by_worker, (before, after)
    assert {node for t, node in after.items() if t not in done_by_worker} == {head}, after
    assert set(_where(cfg, "dedup-filter")) == {head}
    assert {r["id"] for r in iter_corpus(cfg)} == {r["id"] for r in iter_corpus(ref)}
    stats = json.loads((Path(cfg.run.output_dir) / "dedup" / "dedup_stats.json").read_text())
    ref_stats = json.loads((Path(ref.run.output_dir) / "dedup" / "dedup_stats.json").read_text())
    assert stats["per_source"] == ref_stats["per_source"]
    print(f"worker node killed after {len(done_by_worker)} of its tasks; stage finished {elapsed:.1f}s later")
