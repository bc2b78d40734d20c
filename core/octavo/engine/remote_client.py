"""The front end's side of headless engines: ``EngineJoinServer`` takes their handshakes
(``octavo.engine.dp_handshake``) and makes a ``RemoteEngineClient`` of each.

A remote engine has no process here to watch, so its death is its connection's end: the
output socket's monitor reports the disconnect - at once when the node's process dies (its
TCP connection closes), within ``HEARTBEAT_TIMEOUT_MS`` when the node vanishes (ZMTP
heartbeats go unanswered). Only the end of the engine's own, authenticated connection
counts (``ConnectionWatch``): anyone can open a TCP connection to the port and close it.

Nobody without the secret can take a rank or hold the front end's memory: the join port
takes frames of at most ``MAX_FRAME_BYTES`` (a longer one drops the peer before it is
buffered), a ``Hello`` must answer a challenge issued on its own connection, and a rank
whose claimant's connection ends before ``Ready`` is free again. A refusal of an engine
that leaves before it is ready (a node that crashed or gave up) is free again, so a
restarted node can take it, and the wait's timeout names the last refusals.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from octavo.engine.core_client import EngineCoreClient
from octavo.engine.dp_handshake import (
    MAX_FRAME_BYTES,
    ChallengeIssuer,
    Failed,
    Hello,
    Knock,
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
from octavo.engine.peer_watch import ConnectionWatch
from octavo.engine.serial import join_payload

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 10.0  # a log line while the front end waits for engines
LEFT_CHECK_S = 0.5  # how often the wait looks for claimants whose connection ended
FIRST_OUTPUT_TIMEOUT_S = 30.0  # after Ready, for the core's first message (sent before it)


class RemoteEngineClient(EngineCoreClient):
    """The client of an engine core on a headless node."""

    def __init__(self, context: zmq.asyncio.Context, sockets: EngineSockets, rank: int,
                 peer: str) -> None:
        super().__init__(context, sockets)
        self.rank, self.peer = rank, peer
        self.remote_pid: int | None = None  # on its node, once ready
        self._connections: ConnectionWatch[int] = ConnectionWatch(sockets.output)
        self._watcher: asyncio.Task[None] | None = None

    async def claim_connection(self) -> bool:
        """Receive the core's first message (it sends one as soon as it connects, before
        ``Ready``) and claim the connection it came on: only CURVE with this engine's key
        delivers a message, so that connection is the engine's. False when none came
        within ``FIRST_OUTPUT_TIMEOUT_S`` or it has ended already."""
        deadline = time.monotonic() + FIRST_OUTPUT_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            if not await self._output.poll(left * 1000):
                break
            try:
                frames = await self._output.recv_multipart(copy=False)
            except zmq.Again:  # see EngineCoreClient._receive
                continue
            self._connections.ended()
            if not self._connections.claim(frames[0], self.rank):
                return False
            self._dispatch([frame.buffer for frame in frames])
            return True
        return False

    def _dispatch(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Over TCP the core cuts its payloads into frames (``split_payload``)."""
        super()._dispatch(join_payload(buffers))

    def watch(self) -> None:
        """From now on, the end of the claimed connection is the engine's death."""
        self._watcher = self._loop.create_task(self._watch())
        self.start_receiving()

    async def _watch(self) -> None:
        while not self._connections.ended():
            await self._connections.monitor.poll()
        self._on_engine_exit()

    def _stop_core(self) -> None:
        """The node stops the engine on SHUTDOWN; nothing here to wait for."""
        if self._watcher is not None:
            self._watcher.cancel()
        self._connections.close()

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
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        set_heartbeat(self.router)
        self._peers: ConnectionWatch[bytes] = ConnectionWatch(self.router)
        try:
            self.router.bind(f"tcp://{address}:{port}")
        except zmq.ZMQError as exc:
            self.close()
            raise EngineStartError(f"cannot listen for headless engines on "
                                   f"{address}:{port} (--data-parallel-address, "
                                   f"--data-parallel-rpc-port): {exc}") from None
        self._challenges = ChallengeIssuer()
        self._refusals: collections.deque[str] = collections.deque(maxlen=3)  # the last ones
        self._joining: dict[bytes, _Joining] = {}
        self.ready: dict[int, tuple[RemoteEngineClient, Ready]] = {}

    async def gather(self, timeout_s: float) -> dict[int, tuple[RemoteEngineClient, Ready]]:
        """Every expected engine, once ready; raises ``EngineStartError`` when one fails to
        load, or when they are not all there after ``timeout_s`` (naming the last refusals).
        A refused node may be followed by the right one, so a refusal does not end the
        wait; a claimant that leaves frees its rank, so none is held by a node that gave
        up."""
        deadline = time.monotonic() + timeout_s
        next_progress = time.monotonic() + PROGRESS_INTERVAL_S
        logger.info("waiting for %d headless engines (ranks %s) at tcp://%s", len(self.expected),
                    ", ".join(map(str, sorted(self.expected))),
                    self.router.getsockopt_string(zmq.LAST_ENDPOINT).removeprefix("tcp://"))
        while len(self.ready) < len(self.expected):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(self.expected - set(self.ready))
                refused = "; ".join(self._refusals) or "none"
                raise EngineStartError(f"headless engines {missing} did not join within "
                                       f"{timeout_s:.0f} s (the last refusals: {refused})")
            if time.monotonic() >= next_progress:
                next_progress += PROGRESS_INTERVAL_S
                logger.info("still waiting for headless engines: %d of %d ready",
                            len(self.ready), len(self.expected))
            if not await self.router.poll(min(left, LEFT_CHECK_S) * 1000):
                self._free_departed()
                continue
            peer, frame = await self.router.recv_multipart(copy=False)
            self._free_departed()  # after the receive: its connection's events are queued
            await self._handle(peer.bytes, frame)
        return self.ready

    def close(self) -> None:
        """Stop listening (the engines' own sockets stay with their clients)."""
        for joining in self._joining.values():
            joining.client.shutdown()
        self._peers.close()
        self.router.close(linger=0)
        self.context.destroy(linger=0)

    def _free_departed(self) -> None:
        """Free the ranks of claimants whose connection ended before their ``Ready``."""
        for peer in self._peers.ended():
            joining = self._joining.pop(peer, None)
            if joining is not None:
                logger.warning("headless engine %d left before it was ready; rank %d is free "
                               "again", joining.rank, joining.rank)
                joining.client.shutdown()

    async def _handle(self, peer: bytes, frame: zmq.Frame) -> None:
        joining = self._joining.get(peer)
        try:
            message = unseal(frame.bytes, self.secret, joining.salt if joining else "")
            if isinstance(message, Hello) and not self._challenges.verify(peer,
                                                                          message.challenge):
                raise HandshakeError("the Hello does not answer a challenge this front end "
                                     "issued on this connection (a replayed handshake)")
        except HandshakeError as exc:
            self._refuse(peer, str(exc))
            return
        if isinstance(message, Knock) and joining is None:
            self.router.send_multipart([peer, seal(self._challenges.issue(peer), b"")])
        elif isinstance(message, Hello) and joining is None:
            self._welcome(peer, frame, message)
        elif isinstance(message, Ready) and joining is not None:
            await self._accept(peer, joining, message)
        elif isinstance(message, Failed) and joining is not None:
            raise EngineStartError(f"headless engine {joining.rank} failed to start: "
                                   f"{message.reason}")
        else:
            self._refuse(peer, f"unexpected handshake message {type(message).__name__}")

    async def _accept(self, peer: bytes, joining: _Joining, ready: Ready) -> None:
        """Serve the engine once its core's connection is claimed (``claim_connection``)."""
        del self._joining[peer]
        self._peers.release(peer)
        client = joining.client
        if not await client.claim_connection():
            client.shutdown()
            logger.warning("headless engine %d said Ready but its core's connection did not "
                           "come (or ended); rank %d is free again", joining.rank, joining.rank)
            return
        client.remote_pid = ready.pid
        client.watch()
        self.ready[joining.rank] = (client, ready)
        logger.info("headless engine %d ready (pid %d on its node, %d KV blocks)",
                    joining.rank, ready.pid, ready.num_blocks)

    def _welcome(self, peer: bytes, frame: zmq.Frame, hello: Hello) -> None:
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
        elif not self._peers.claim(frame, peer):
            return  # it left already
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
        self._refusals.append(reason)
        self.router.send_multipart([peer, seal(Refused(reason), self.secret)])
