"""The engine core's two sockets: where they live and who may use them, in one place.

The API process binds both (PUSH for inputs, PULL for outputs) and the core process
connects. Two locks, so that no other process can read the requests (prompts included) or
forge the core's outputs:

- The sockets are ``ipc://`` paths in a fresh directory only this user can enter (mode
  0700, under ``$XDG_RUNTIME_DIR`` when usable, else the temp dir), removed at shutdown:
  no TCP port is open, and other users cannot even reach the paths.
- Every socket runs ZMQ CURVE with keys made for this launch. The API process's sockets are
  CURVE servers that a ZAP authenticator lets accept only the core's public key; the core's
  are CURVE clients. A process of the same user, which can reach the paths, can neither
  take a share of the requests nor push a frame. The keys reach the core process in its
  spawn arguments (the pipe ``multiprocessing`` sends them through, private to parent and
  child), never through the environment or a file.

CURVE does not care about the transport, so a TCP address (headless or multi-node engines)
would be authenticated and encrypted the same way: it would only change the addresses
made here.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.auth.thread import ThreadAuthenticator

from octavo.paths import MAX_SOCKET_PATH, SOCKET_DIR_PREFIX, make_socket_dir

__all__ = ["MAX_SOCKET_PATH", "SOCKET_DIR_PREFIX", "CoreEndpoint", "EngineSockets",
           "make_socket_dir"]

ZAP_DOMAIN = "octavo-engine"
_SOCKET_NAMES = ("input", "output")


@dataclass(frozen=True)
class CoreEndpoint:
    """What the core process needs to reach the API process's sockets: their addresses,
    the API process's public key, and the core's own keypair (pickled into its spawn
    arguments; the secret key is kept out of the repr, so no log line shows it)."""

    input_address: str
    output_address: str
    server_public_key: bytes
    public_key: bytes
    secret_key: bytes = field(repr=False)
    directory: Path  # the sockets' private directory

    def remove_directory(self) -> None:
        """For the core when the API process died without removing it (SIGKILL)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def connect(self, context: zmq.Context, socket_type: int, address: str) -> zmq.Socket:
        """A CURVE client socket of ``socket_type`` connected to ``address``."""
        socket = context.socket(socket_type)
        socket.setsockopt(zmq.LINGER, 0)
        socket.curve_serverkey = self.server_public_key
        socket.curve_publickey = self.public_key
        socket.curve_secretkey = self.secret_key
        socket.connect(address)
        return socket


class _OnlyKey:
    """The ZAP authenticator's credentials check: exactly one client public key passes."""

    def __init__(self, public_key: bytes) -> None:
        self._public_key = public_key

    def callback(self, domain: str, key: bytes) -> bool:
        return domain == ZAP_DOMAIN and key == self._public_key


class EngineSockets:
    """The API process's side: the private directory, this launch's keys, the ZAP
    authenticator, and the two bound sockets (``input``: PUSH, ``output``: PULL)."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self.directory = make_socket_dir()
        self._auth: ThreadAuthenticator | None = None
        self._sockets: list[zmq.asyncio.Socket] = []
        try:
            server_public, server_secret = zmq.curve_keypair()
            core_public, core_secret = zmq.curve_keypair()
            self._auth = ThreadAuthenticator(context)
            self._auth.start()
            self._auth.configure_curve_callback(ZAP_DOMAIN, _OnlyKey(core_public))
            input_address, output_address = (f"ipc://{self.directory / name}"
                                             for name in _SOCKET_NAMES)
            self.input = self._bind(context, zmq.PUSH, input_address, server_secret)
            self.output = self._bind(context, zmq.PULL, output_address, server_secret)
        except BaseException:
            self.close()
            raise
        self.core = CoreEndpoint(input_address, output_address, server_public, core_public,
                                 core_secret, self.directory)

    def close(self) -> None:
        """Close the sockets, stop the authenticator and remove the directory. Idempotent;
        call it before the context is destroyed (the authenticator's sockets live in it)."""
        for socket in self._sockets:
            socket.close(linger=0)
        self._sockets.clear()
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def _bind(self, context: zmq.asyncio.Context, socket_type: int, address: str,
              secret_key: bytes) -> zmq.asyncio.Socket:
        socket = context.socket(socket_type)
        self._sockets.append(socket)
        socket.setsockopt(zmq.LINGER, 0)
        socket.curve_server = True
        socket.curve_secretkey = secret_key
        socket.zap_domain = ZAP_DOMAIN.encode()
        socket.bind(address)
        return socket
