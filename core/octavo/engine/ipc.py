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

An engine on a headless node (``octavo serve --headless``) reaches the front end over TCP
instead: the sockets bind to ``--data-parallel-address`` on ports the system picks, with
ZMTP heartbeats (a vanished peer is noticed within ``HEARTBEAT_TIMEOUT_MS``), and the keys
are not sent at all: both ends derive them from the shared secret and the two nonces of
their handshake (``CurveKeys.derive``, ``octavo.engine.dp_handshake``). CURVE then
authenticates and encrypts the TCP traffic as it does the ``ipc://`` traffic. Anyone who
reaches a TCP port can send a frame before CURVE refuses them, and libzmq buffers a frame
whole: so the input socket takes frames of at most ``MAX_HANDSHAKE_BYTES`` and the output
socket of at most ``TCP_FRAME_BYTES`` (the core cuts its messages to fit,
``serial.split_payload``).
"""

from __future__ import annotations

import hashlib
import hmac
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.utils.z85
from zmq.auth.thread import ThreadAuthenticator

from octavo.paths import MAX_SOCKET_PATH, SOCKET_DIR_PREFIX, make_socket_dir

__all__ = ["MAX_SOCKET_PATH", "SOCKET_DIR_PREFIX", "CoreEndpoint", "CurveKeys",
           "EngineSockets", "make_socket_dir", "set_heartbeat"]

ZAP_DOMAIN = "octavo-engine"
_SOCKET_NAMES = ("input", "output")
HEARTBEAT_IVL_MS = 1000  # TCP sockets ping their peer this often...
HEARTBEAT_TIMEOUT_MS = 3000  # ...and drop the connection when no answer came for this long
MAX_HANDSHAKE_BYTES = 4096  # of a frame on the input socket, which receives no message
TCP_FRAME_BYTES = 64 << 10  # of a payload frame on a TCP output socket (the core splits)
CURVE_FRAME_OVERHEAD = 256  # what CURVE adds to a frame on the wire (33 bytes), with room


@dataclass(frozen=True)
class CurveKeys:
    """The API process's (server) and the core's (client) CURVE key pairs, z85-encoded."""

    server_public: bytes
    server_secret: bytes = field(repr=False)
    client_public: bytes
    client_secret: bytes = field(repr=False)

    @classmethod
    def fresh(cls) -> CurveKeys:
        """Keys for one launch on this node (they reach the core in its spawn arguments)."""
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    @classmethod
    def derive(cls, secret: bytes, salt: bytes) -> CurveKeys:
        """The same keys on both nodes, from the shared secret and the handshake's nonces:
        no key travels, and one who lacks the secret cannot compute them."""
        def keypair(label: bytes) -> tuple[bytes, bytes]:
            raw = hmac.new(secret, label + salt, hashlib.sha256).digest()
            private = zmq.utils.z85.encode(raw)
            return zmq.curve_public(private), private

        server_public, server_secret = keypair(b"octavo-dp-server")
        client_public, client_secret = keypair(b"octavo-dp-client")
        return cls(server_public, server_secret, client_public, client_secret)


def set_heartbeat(socket: zmq.Socket) -> None:
    """ZMTP heartbeats on a TCP socket: a peer that vanished without closing its connection
    (a node powered off, a cable pulled) is disconnected, and its monitor says so."""
    socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    socket.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)


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
    directory: Path | None  # the sockets' private directory; None for TCP

    @property
    def is_tcp(self) -> bool:
        return self.input_address.startswith("tcp://")

    def remove_directory(self) -> None:
        """For the core when the API process died without removing it (SIGKILL)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def connect(self, context: zmq.Context, socket_type: int, address: str) -> zmq.Socket:
        """A CURVE client socket of ``socket_type`` connected to ``address``."""
        socket = context.socket(socket_type)
        socket.setsockopt(zmq.LINGER, 0)
        socket.curve_serverkey = self.server_public_key
        socket.curve_publickey = self.public_key
        socket.curve_secretkey = self.secret_key
        if self.is_tcp:
            set_heartbeat(socket)
        socket.connect(address)
        return socket


class _OnlyKey:
    """The ZAP authenticator's credentials check: exactly one client public key passes."""

    def __init__(self, public_key: bytes) -> None:
        self._public_key = public_key

    def callback(self, domain: str, key: bytes) -> bool:
        return domain == ZAP_DOMAIN and key == self._public_key


class EngineSockets:
    """The API process's side: the private directory (or a TCP host), the keys, the ZAP
    authenticator, and the two bound sockets (``input``: PUSH, ``output``: PULL)."""

    def __init__(self, context: zmq.asyncio.Context, tcp_host: str | None = None,
                 keys: CurveKeys | None = None) -> None:
        """``ipc://`` in a new private directory, or with ``tcp_host`` TCP ports the system
        picks there; ``keys``: fresh ones unless given (derived, for a headless engine)."""
        self.directory = None if tcp_host is not None else make_socket_dir()
        self._auth: ThreadAuthenticator | None = None
        self._sockets: list[zmq.asyncio.Socket] = []
        keys = keys or CurveKeys.fresh()
        try:
            self._auth = ThreadAuthenticator(context)
            self._auth.start()
            self._auth.configure_curve_callback(ZAP_DOMAIN, _OnlyKey(keys.client_public))
            addresses = [f"tcp://{tcp_host}:0" if self.directory is None
                         else f"ipc://{self.directory / name}" for name in _SOCKET_NAMES]
            self.input = self._bind(context, zmq.PUSH, addresses[0], keys.server_secret)
            self.output = self._bind(context, zmq.PULL, addresses[1], keys.server_secret)
        except BaseException:
            self.close()
            raise
        self.core = CoreEndpoint(_bound_address(self.input), _bound_address(self.output),
                                 keys.server_public, keys.client_public, keys.client_secret,
                                 self.directory)

    def close(self) -> None:
        """Close the sockets, stop the authenticator and remove the directory. Idempotent;
        call it before the context is destroyed (the authenticator's sockets live in it)."""
        for socket in self._sockets:
            socket.close(linger=0)
        self._sockets.clear()
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _bind(self, context: zmq.asyncio.Context, socket_type: int, address: str,
              secret_key: bytes) -> zmq.asyncio.Socket:
        socket = context.socket(socket_type)
        self._sockets.append(socket)
        socket.setsockopt(zmq.LINGER, 0)
        socket.curve_server = True
        socket.curve_secretkey = secret_key
        socket.zap_domain = ZAP_DOMAIN.encode()
        if socket_type == zmq.PUSH:  # it receives only CURVE's handshake: bound it
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_HANDSHAKE_BYTES)
        if address.startswith("tcp://"):
            set_heartbeat(socket)
            if socket_type == zmq.PULL:  # a stranger's frame, before CURVE, is cut here
                socket.setsockopt(zmq.MAXMSGSIZE, TCP_FRAME_BYTES + CURVE_FRAME_OVERHEAD)
        socket.bind(address)
        return socket


def _bound_address(socket: zmq.asyncio.Socket) -> str:
    """Where the socket listens (a TCP port the system picked, for ``tcp://host:0``)."""
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)
