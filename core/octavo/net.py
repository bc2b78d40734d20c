"""Loopback ports: ``free_port`` asks the OS for a TCP port free now (bind to port 0, read it
back, release it), for a rendezvous, a server in a test or a benchmark. Another process may
take the port before the caller binds it; every caller binds soon after, and a clash fails
loudly (address in use), never silently."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
