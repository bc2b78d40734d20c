"""torch.distributed's rendezvous, listening only where it was told to.

``init_process_group(init_method="tcp://host:port")`` makes rank 0 serve a ``TCPStore``
on every interface (``*:port``), whatever ``host`` says, with no authentication: anyone
who reaches the machine could read and write its keys. So rank 0 binds the socket itself,
to ``host`` only (127.0.0.1 for the ``mp`` executor; rank 0's node address for Ray), and
hands it to the store (``master_listen_fd``). Gloo's own sockets are kept on loopback by
the executors (``GLOO_SOCKET_IFNAME=lo`` where every rank is on this machine).
"""

from __future__ import annotations

import datetime
import socket
from urllib.parse import urlsplit

import torch.distributed as dist


def rendezvous_store(init_method: str, rank: int, world_size: int | None,
                     timeout: datetime.timedelta) -> dist.TCPStore:
    """The store of ``init_method`` (``tcp://host:port``); rank 0 serves it on ``host``.
    ``world_size`` None: the server does not wait for its clients to connect."""
    url = urlsplit(init_method)
    if url.scheme != "tcp" or url.hostname is None or url.port is None:
        raise ValueError(f"the rendezvous must be tcp://host:port, not {init_method!r}")
    listen_fd = _listen(url.hostname, url.port) if rank == 0 else None
    return dist.TCPStore(url.hostname, url.port, world_size, rank == 0, timeout,
                         master_listen_fd=listen_fd)


def _listen(host: str, port: int) -> int:
    """A socket listening on ``host:port`` only; its descriptor, now the store's to close."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family).detach()
