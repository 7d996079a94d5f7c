"""Network helpers shared by the floors above."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, for a store or server that only processes on this machine must find."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
