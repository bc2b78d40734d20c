"""The front end's side of headless engines: ``EngineJoinServer`` takes their handshakes
(``octavo.engine.dp_handshake``) and makes a ``RemoteEngineClient`` of each.

A remote engine has no process here to watch, so its death is its connection's end: the
output socket's monitor reports the disconnect - at once when the node's process dies (its
TCP connection closes), within ``HEARTBEAT_TIMEOUT_MS`` when the node vanishes (ZMTP
heartbeats go unanswered).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from octavo.engine.core_client import EngineCoreClient
from octavo.engine.dp_handshake import (
    Failed,
    Hello,
    Ready,
    Refused,
    Welcome,
    identity_mismatch,
    new_nonce,
    seal,
    unseal,
)
from octavo.engine.errors import EngineStartError, HandshakeError
from octavo.engine.ipc import CurveKeys, EngineSockets, set_heartbeat

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 10.0  # a log line while the front end waits for engines


class RemoteEngineClient(EngineCoreClient):
    """The client of an engine core on a headless node."""

    def __init__(self, context: zmq.asyncio.Context, sockets: EngineSockets, rank: int,
                 peer: str) -> None:
        super().__init__(context, sockets)
        self.rank, self.peer = rank, peer
        self.remote_pid: int | None = None  # on its node, once ready
        self._monitor = sockets.output.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._watcher: asyncio.Task[None] | None = None

    def watch(self) -> None:
        """From now on, the connection's end is the engine's death."""
        self._watcher = self._loop.create_task(self._watch())
        self.start_receiving()

    async def _watch(self) -> None:
        connected = False
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                connected = True
            elif event == zmq.EVENT_DISCONNECTED and connected:
                self._on_engine_exit()
                return

    def _stop_core(self) -> None:
        """The node stops the engine on SHUTDOWN; nothing here to wait for."""
        if self._watcher is not None:
            self._watcher.cancel()
        self._monitor.close(linger=0)

    def death_message(self) -> str:
        return (f"data-parallel engine {self.rank} (pid {self.remote_pid} on the headless "
                f"node {self.peer}) disconnected")


@dataclass
class _Joining:
    rank: int
    salt: str  # both nonces: what the engine's later messages are sealed over
    client: RemoteEngineClient


class EngineJoinServer:
    """Binds ``tcp://address:port`` and takes the handshakes of the engines of ``ranks``."""

    def __init__(self, address: str, port: int, secret: bytes, identity: dict[str, str],
                 ranks: list[int]) -> None:
        self.address, self.secret, self.identity = address, secret, identity
        self.expected = set(ranks)
        self.context = zmq.asyncio.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        set_heartbeat(self.router)
        try:
            self.router.bind(f"tcp://{address}:{port}")
        except zmq.ZMQError as exc:
            self.close()
            raise EngineStartError(f"cannot listen for headless engines on "
                                   f"{address}:{port} (--data-parallel-address, "
                                   f"--data-parallel-rpc-port): {exc}") from None
        self._joining: dict[bytes, _Joining] = {}
        self.ready: dict[int, tuple[RemoteEngineClient, Ready]] = {}

    async def gather(self, timeout_s: float) -> dict[int, tuple[RemoteEngineClient, Ready]]:
        """Every expected engine, once ready; raises ``EngineStartError`` when one fails to
        load, or when they are not all there after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        logger.info("waiting for %d headless engines (ranks %s) at tcp://%s", len(self.expected),
                    ", ".join(map(str, sorted(self.expected))),
                    self.router.getsockopt_string(zmq.LAST_ENDPOINT).removeprefix("tcp://"))
        while len(self.ready) < len(self.expected):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(self.expected - set(self.ready))
                raise EngineStartError(f"headless engines {missing} did not join within "
                                       f"{timeout_s:.0f} s")
            if not await self.router.poll(min(left, PROGRESS_INTERVAL_S) * 1000):
                logger.info("still waiting for headless engines: %d of %d ready",
                            len(self.ready), len(self.expected))
                continue
            peer, data = await self.router.recv_multipart()
            self._handle(peer, data)
        return self.ready

    def close(self) -> None:
        """Stop listening (the engines' own sockets stay with their clients)."""
        for joining in self._joining.values():
            joining.client.shutdown()
        self.router.close(linger=0)
        self.context.destroy(linger=0)

    def _handle(self, peer: bytes, data: bytes) -> None:
        joining = self._joining.get(peer)
        try:
            message = unseal(data, self.secret, joining.salt if joining else "")
        except HandshakeError as exc:
            self._refuse(peer, str(exc))
            return
        if isinstance(message, Hello) and joining is None:
            self._welcome(peer, message)
        elif isinstance(message, Ready) and joining is not None:
            del self._joining[peer]
            joining.client.remote_pid = message.pid
            joining.client.watch()
            self.ready[joining.rank] = (joining.client, message)
            logger.info("headless engine %d ready (pid %d on its node, %d KV blocks)",
                        joining.rank, message.pid, message.num_blocks)
        elif isinstance(message, Failed) and joining is not None:
            raise EngineStartError(f"headless engine {joining.rank} failed to start: "
                                   f"{message.reason}")
        else:
            self._refuse(peer, f"unexpected handshake message {type(message).__name__}")

    def _welcome(self, peer: bytes, hello: Hello) -> None:
        taken = {joining.rank for joining in self._joining.values()} | set(self.ready)
        mismatch = identity_mismatch(self.identity, hello.identity)
        if hello.protocol != Hello.protocol:
            reason = f"handshake protocol {hello.protocol}; the front end speaks {Hello.protocol}"
        elif hello.rank not in self.expected:
            reason = (f"rank {hello.rank} is not one the front end waits for "
                      f"({sorted(self.expected)})")
        elif hello.rank in taken:
            reason = f"rank {hello.rank} has joined already"
        elif mismatch is not None:
            reason = f"the engine's model or config differs from the front end's: {mismatch}"
        else:
            nonce = new_nonce()
            salt = hello.nonce + nonce
            context = zmq.asyncio.Context()
            sockets = EngineSockets(context, tcp_host=self.address,
                                    keys=CurveKeys.derive(self.secret, salt.encode()))
            client = RemoteEngineClient(context, sockets, hello.rank, hello.node)
            self._joining[peer] = _Joining(hello.rank, salt, client)
            welcome = Welcome(nonce, sockets.core.input_address, sockets.core.output_address)
            self.router.send_multipart([peer, seal(welcome, self.secret, hello.nonce)])
            logger.info("headless engine %d joined from %s; it loads the model", hello.rank,
                        hello.node)
            return
        self._refuse(peer, reason)

    def _refuse(self, peer: bytes, reason: str) -> None:
        logger.error("refused a headless engine's handshake: %s", reason)
        self.router.send_multipart([peer, seal(Refused(reason), self.secret)])
