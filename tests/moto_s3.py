"""A real S3 API for tests: moto in server mode, started and stopped by the fixture (no network beyond
127.0.0.1); the AWS_* variables point every fsspec/s3fs client, in this process and its children, at it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from core.net import free_port


@contextlib.contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    pytest.importorskip("moto.server", reason="moto[server] (test extra) not installed")
    pytest.importorskip("s3fs", reason="s3fs (lmstack[s3]) not installed")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        try:
            deadline = time.time() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.time() > deadline or proc.poll() is not None:
                        raise RuntimeError("moto server did not start") from None
                    time.sleep(0.2)
            yield env
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            import s3fs

            s3fs.S3FileSystem.clear_instance_cache()  # clients bound to this endpoint (fsspec caches per class)


@pytest.fixture
def s3_server():
    with moto_server() as env:
        yield env


@pytest.fixture(scope="module")
def s3_server_module():
    with moto_server() as env:
        yield env


def s3fs_client(env: dict[str, str]):
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": env["AWS_ENDPOINT_URL"]}, skip_instance_cache=True
    )
