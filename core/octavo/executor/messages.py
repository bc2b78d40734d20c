"""What the executors with workers outside the core's process (``mp``, ``ray``) and their
workers say to each other, and how it is encoded.

Every call goes to every worker - through ``mp``'s broadcast queue, or once into Ray's object
store for ``ray`` - as a kind byte, then the msgpack of the payload (``octavo.codec``; never
pickle): the step's ``SchedulerOutput``, an ``RpcCall``, or nothing for SHUTDOWN. Every worker
answers every call with a ``WorkerReply`` (``mp``: on its own reply queue; ``ray``: as the
actor call's result): the output rank with the step's ``ModelRunnerOutput``, the others with
an empty one, so that an error on any rank reaches the engine as that step's error.

``mp``'s start-up messages (``WorkerInit``, ``WorkerReady``) go over the pipe that also tells
a worker its parent died; they hold the engine's config, so they are pickled, once per
launch, as multiprocessing's own spawn arguments are (``ray`` hands its actors their
``RayWorkerInit`` through Ray).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octavo import codec
from octavo.config import EngineConfig
from octavo.executor.shm_queue import QueueHandle
from octavo.outputs import ModelRunnerOutput, SchedulerOutput


class CallKind(bytes, enum.Enum):
    EXECUTE = b"\x00"  # payload: SchedulerOutput
    RPC = b"\x01"  # payload: RpcCall
    SHUTDOWN = b"\x02"  # no payload


@dataclass
class RpcCall:
    method: str
    args: list[Any] = field(default_factory=list)


@dataclass
class WorkerReply:
    error: str | None = None  # the exception and traceback when the call raised
    output: ModelRunnerOutput | None = None  # EXECUTE on the output rank
    result: Any = None  # RPC


@dataclass
class WorkerInit:
    config: EngineConfig
    rank: int
    init_method: str  # torch.distributed's rendezvous, tcp://127.0.0.1:<free port>
    broadcast: QueueHandle
    socket_dir: Path  # private (0700): where the worker binds its reply queue's socket


@dataclass
class WorkerReady:
    rank: int
    pid: int
    reply: QueueHandle


_CALL_TYPES: dict[CallKind, Any] = {CallKind.EXECUTE: SchedulerOutput, CallKind.RPC: RpcCall}


class CallCodec:
    def __init__(self) -> None:
        self._encoder = codec.encoder()
        self._decoders = {kind: codec.decoder(t) for kind, t in _CALL_TYPES.items()}

    def encode(self, kind: CallKind, payload: Any = None) -> bytes:
        return kind.value + (b"" if payload is None else self._encoder.encode(payload))

    def decode(self, message: bytes) -> tuple[CallKind, Any]:
        kind = CallKind(message[:1])
        decoder = self._decoders.get(kind)
        return kind, None if decoder is None else decoder.decode(memoryview(message)[1:])


class ReplyCodec:
    def __init__(self) -> None:
        self._encoder = codec.encoder()
        self._decoder = codec.decoder(WorkerReply)

    def encode(self, reply: WorkerReply) -> bytes:
        return self._encoder.encode(reply)

    def decode(self, message: bytes) -> WorkerReply:
        return self._decoder.decode(message)
