"""``EngineCoreClient``: the front end's side of the engine core process.

It starts the process, sends it requests over ZMQ (asyncio sockets, so sending never
blocks the event loop) and gathers what comes back: step outputs into one queue for the
output handler, utility results to the futures of their callers.

The sockets are private and authenticated (``octavo.engine.ipc``): ``ipc://`` paths in a
directory of mode 0700, CURVE servers that accept only this launch's core. A frame that
does not decode is dropped and logged, never taken for the engine's death.

Engine death is noticed at once, not by a timeout: the process's sentinel (a pipe that
closes when it exits) is watched by the event loop, and from then on every call raises
``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

import zmq
import zmq.asyncio

from octavo.config import EngineConfig
from octavo.engine.core_proc import EngineReady, read_handshake, start_engine_core_process
from octavo.engine.errors import EngineDeadError, EngineStepError, InvalidRequestError
from octavo.engine.ipc import EngineSockets
from octavo.engine.serial import Decoder, Encoder, OutputKind, RequestKind, log_dropped_frame
from octavo.outputs import (
    STEP_FAILED,
    EngineCoreOutput,
    EngineCoreOutputs,
    UtilityCall,
    UtilityResult,
)
from octavo.request import Request

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 5.0


def request_error(output: EngineCoreOutput) -> Exception:
    """What a request the core ended with ``output.error`` fails with: ``EngineStepError``
    when a step it was in failed, else ``InvalidRequestError`` (the core refused it)."""
    message = output.error or "the engine ended the request"
    if output.finish_reason == STEP_FAILED:
        return EngineStepError(message)
    return InvalidRequestError(message)


@dataclass
class EngineStatus:
    """One engine as ``/health`` shows it."""

    index: int  # its data-parallel rank
    alive: bool
    pid: int | None  # None for an engine on another node


class EngineClient(Protocol):
    """What ``AsyncLLM`` needs of its engines: one core (``EngineCoreClient``) or several
    data-parallel ones (``octavo.engine.dp_client``)."""

    @property
    def dead(self) -> bool:
        """Whether no engine is left to serve."""

    def add_requests(self, requests: list[Request]) -> None: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...

    async def call_utility(self, method: str, *args: Any) -> Any: ...

    async def get_output(self) -> EngineCoreOutputs: ...

    def check_alive(self) -> None: ...

    def death_message(self) -> str: ...

    def statuses(self) -> list[EngineStatus]: ...

    def shutdown(self) -> None: ...


class EngineCoreClient:
    """The client of one engine core process on this node (``RemoteEngineClient``: one on
    a headless node)."""

    def __init__(self, context: zmq.asyncio.Context, sockets: EngineSockets) -> None:
        """Take over the context and the bound sockets; use ``start()``."""
        self._loop = asyncio.get_running_loop()
        self._context = context
        self.sockets = sockets
        self._input, self._output = sockets.input, sockets.output
        self._encoder = Encoder()
        self._decoder = Decoder(OutputKind)
        self._outputs: asyncio.Queue[EngineCoreOutputs | EngineDeadError] = asyncio.Queue()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._receiver: asyncio.Task[None] | None = None
        self.dead = False
        self._closed = False
        self.proc: BaseProcess | None = None

    @classmethod
    async def start(cls, config: EngineConfig) -> tuple[EngineCoreClient, EngineReady]:
        """Bind the sockets, spawn the core process and wait (without blocking the loop)
        until it has loaded the model; raises ``EngineStartError`` with the reason when it
        cannot."""
        context = zmq.asyncio.Context()
        try:
            sockets = EngineSockets(context)
        except BaseException:
            context.destroy(linger=0)
            raise
        client = cls(context, sockets)
        try:
            client.proc, handshake = start_engine_core_process(config, sockets.core)
        except BaseException:
            client.shutdown()
            raise
        try:
            await _readable(client._loop, handshake.fileno())
            ready = read_handshake(client.proc, handshake)
        except BaseException:
            client.shutdown()
            raise
        finally:
            handshake.close()
        client._loop.add_reader(client.proc.sentinel, client._on_engine_exit)
        client.start_receiving()
        return client, ready

    def start_receiving(self) -> None:
        self._receiver = self._loop.create_task(self._receive())

    def add_request(self, request: Request) -> None:
        """Queue the request on the socket (sends keep their order; none waits here)."""
        self._send(RequestKind.ADD, request)

    def add_requests(self, requests: list[Request]) -> None:
        """A user request's samples (n > 1: one engine request each)."""
        for request in requests:
            self.add_request(request)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def statuses(self) -> list[EngineStatus]:
        return [EngineStatus(0, not self.dead, self.pid)]

    def abort_requests(self, request_ids: list[str]) -> None:
        """Like ``add_request``, and a no-op once the core is gone, so cleanup code (a
        disconnected client's generator) can always call it."""
        if request_ids and not self.dead:
            self._send(RequestKind.ABORT, request_ids)

    async def call_utility(self, method: str, *args: Any) -> Any:
        """Run ``EngineCore.<method>(*args)`` in the core process and return its result."""
        call_id = next(self._call_ids)
        future = self._loop.create_future()
        self._calls[call_id] = future
        try:
            await self._send(RequestKind.UTILITY, UtilityCall(call_id, method, list(args)))
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def get_output(self) -> EngineCoreOutputs:
        """The next step's outputs; raises ``EngineDeadError`` once the core is gone."""
        return await next_output(self._outputs)

    def shutdown(self) -> None:
        """Stop the core process (by message, then by SIGKILL) and close the sockets.
        Idempotent; safe whether or not the process is still alive."""
        if self._closed:
            return
        self._closed = True
        if self._receiver is not None:
            self._receiver.cancel()
        if not self.dead:
            # A synchronous view of the socket: shutdown may run with no event loop running.
            sync_input: zmq.Socket[bytes] = zmq.Socket.shadow(self._input.underlying)
            with contextlib.suppress(zmq.Again):  # a core that is gone takes nothing
                sync_input.send_multipart(self._encoder.encode(RequestKind.SHUTDOWN),
                                          zmq.NOBLOCK)
        self._stop_core()
        self.sockets.close()
        self._context.destroy(linger=0)
        self._fail_all(EngineDeadError("the engine was shut down"))

    def _stop_core(self) -> None:
        """Wait for the process to obey SHUTDOWN; kill it if it does not."""
        if self.proc is None:
            return
        self._loop.remove_reader(self.proc.sentinel)
        self.proc.join(SHUTDOWN_TIMEOUT_S)
        if self.proc.is_alive():  # it ignores SIGTERM, so no polite signal is left
            logger.warning("engine core process %d did not stop; killing it", self.proc.pid)
            self.proc.kill()
            self.proc.join()

    def check_alive(self) -> None:
        """Raise ``EngineDeadError`` if the core process is gone."""
        if self.dead:
            raise EngineDeadError(self.death_message())

    def _send(self, kind: RequestKind, payload: Any) -> Awaitable[Any]:
        self.check_alive()
        return self._input.send_multipart(self._encoder.encode(kind, payload), copy=False)

    async def _receive(self) -> None:
        try:
            while True:
                try:
                    frames = await self._output.recv_multipart(copy=False)
                except zmq.Again:
                    # pyzmq's asyncio socket can wake with no message (seen once per TCP
                    # connection, on the first output of a headless engine); a message is
                    # received whole or not at all, so nothing was lost: wait again.
                    continue
                self._dispatch([frame.buffer for frame in frames])
        except Exception as exc:  # without this task no output arrives: fail, don't hang
            logger.exception("lost the engine core's output stream")
            self._fail_all(EngineDeadError(f"lost the engine core's output stream: {exc}"))

    def _dispatch(self, buffers: Sequence[bytes | memoryview]) -> None:
        """One message from the core: a utility call's result, or a step's outputs."""
        try:
            kind, payload = self._decoder.decode(buffers)
        except Exception as exc:  # one bad frame is not the engine's death
            log_dropped_frame("output", exc)
            return
        if kind is OutputKind.UTILITY_RESULT:
            self._resolve_call(payload)
        else:
            self._outputs.put_nowait(payload)

    def _resolve_call(self, result: UtilityResult) -> None:
        future = self._calls.get(result.call_id)
        if future is None or future.done():
            return  # its caller gave up (cancelled)
        if result.error is not None:
            future.set_exception(RuntimeError(result.error))
        else:
            future.set_result(result.result)

    def _on_engine_exit(self) -> None:
        if self.proc is not None:
            self._loop.remove_reader(self.proc.sentinel)
            self.proc.join()
        self.dead = True
        message = self.death_message()
        logger.error(message)
        self._fail_all(EngineDeadError(message))

    def death_message(self) -> str:
        assert self.proc is not None
        return (f"the engine core process (pid {self.proc.pid}) exited with code "
                f"{self.proc.exitcode}")

    def _fail_all(self, error: EngineDeadError) -> None:
        self.dead = True
        self._outputs.put_nowait(error)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)


async def next_output(queue: asyncio.Queue[EngineCoreOutputs | EngineDeadError],
                      ) -> EngineCoreOutputs:
    """The next outputs from ``queue``; the ``EngineDeadError`` that ends it is raised, and
    left there, so every later call fails the same way."""
    item = await queue.get()
    if isinstance(item, EngineDeadError):
        queue.put_nowait(item)
        raise item
    return item


async def _readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Wait until ``fd`` is readable, letting the loop run (and be cancelled) meanwhile."""
    ready = loop.create_future()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
