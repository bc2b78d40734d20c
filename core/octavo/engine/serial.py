"""The wire between ``AsyncLLM`` and ``EngineCoreProc``: message kinds and their encoding.

Messages are the engine's own plain dataclasses - ``Request`` (with its ``SamplingParams``)
one way, ``EngineCoreOutputs`` and the utility calls the other, all defined in
``octavo.outputs`` - encoded with msgspec's msgpack (``octavo.codec``).

A message is two ZMQ frames: one byte naming its kind, then the payload (over TCP, the
payload in frames of at most ``ipc.TCP_FRAME_BYTES``: ``split_payload``). A message that
does not decode is dropped by its receiver, with a rate-limited warning
(``log_dropped_frame``): it is never a reason to stop serving. A dropped request that
names itself (``undecodable_request_id``) is refused, so its client is not left waiting.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from octavo import codec
from octavo.logger import RateLimitFilter
from octavo.outputs import EngineCoreOutputs, UtilityCall, UtilityResult
from octavo.request import Request

_NUM_FRAMES = 2  # kind, payload

# At most one line per 10 s (saying how many were dropped meanwhile): a peer pushing garbage
# must not flood the log as well.
_dropped_frames = logging.getLogger(f"{__name__}.dropped")
_dropped_frames.addFilter(RateLimitFilter(interval_s=10.0))


class RequestKind(bytes, enum.Enum):
    """What the front end sends to the engine core."""

    ADD = b"\x00"  # payload: Request
    ABORT = b"\x01"  # payload: list of engine request ids
    UTILITY = b"\x02"  # payload: UtilityCall
    SHUTDOWN = b"\x03"  # payload: empty


class OutputKind(bytes, enum.Enum):
    """What the engine core sends back."""

    OUTPUTS = b"\x00"  # payload: EngineCoreOutputs
    UTILITY_RESULT = b"\x01"  # payload: UtilityResult


_REQUEST_TYPES: dict[RequestKind, Any] = {
    RequestKind.ADD: Request,
    RequestKind.ABORT: list[str],
    RequestKind.UTILITY: UtilityCall,
}
_OUTPUT_TYPES: dict[OutputKind, Any] = {
    OutputKind.OUTPUTS: EngineCoreOutputs,
    OutputKind.UTILITY_RESULT: UtilityResult,
}


class Encoder:
    def __init__(self) -> None:
        self._encoder = codec.encoder()

    def encode(self, kind: RequestKind | OutputKind, payload: Any = None) -> list[bytes]:
        return [kind.value, b"" if payload is None else self._encoder.encode(payload)]


class Decoder:
    """Decodes one direction's messages (``RequestKind`` or ``OutputKind``) into typed
    objects; a message of an unknown kind or frame count is an error (which its receiver
    logs and drops), not silently ignored."""

    def __init__(self, kinds: type[RequestKind] | type[OutputKind]) -> None:
        types = _REQUEST_TYPES if kinds is RequestKind else _OUTPUT_TYPES
        self._kinds = kinds
        self._decoders = {kind: codec.decoder(t) for kind, t in types.items()}

    def decode(self, frames: Sequence[bytes | memoryview]) -> tuple[Any, Any]:
        if len(frames) != _NUM_FRAMES:
            raise ValueError(f"a message has {_NUM_FRAMES} frames, not {len(frames)}")
        kind = self._kinds(bytes(frames[0]))
        decoder = self._decoders.get(kind)
        return kind, None if decoder is None else decoder.decode(frames[1])


def split_payload(frames: list[bytes], limit: int) -> list[bytes | memoryview]:
    """A message with its payload cut into frames of at most ``limit`` bytes, for a socket
    that drops a peer sending a longer frame (a TCP socket, which anyone who reaches it can
    send a frame before authenticating: libzmq would buffer it whole)."""
    kind, payload = frames
    view = memoryview(payload)
    chunks: list[bytes | memoryview] = [view[start:start + limit]
                                        for start in range(0, len(view), limit)]
    return [kind, *(chunks or [b""])]


def join_payload(buffers: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """``split_payload``'s message as ``Decoder.decode`` takes it."""
    if len(buffers) <= _NUM_FRAMES:
        return list(buffers)
    return [buffers[0], b"".join(buffers[1:])]


def undecodable_request_id(frames: list[bytes] | list[memoryview]) -> str | None:
    """The request id in an ADD message that failed to decode, read without the types, so
    the core can refuse that request instead of leaving its client waiting forever; None
    when the message holds none."""
    if len(frames) != _NUM_FRAMES or bytes(frames[0]) != RequestKind.ADD.value:
        return None
    try:
        payload = msgspec.msgpack.decode(frames[1])
    except Exception:
        return None
    request_id = payload.get("request_id") if isinstance(payload, dict) else None
    return request_id if isinstance(request_id, str) else None


def log_dropped_frame(direction: str, error: Exception) -> None:
    """Log a message that failed to decode and was dropped (``direction``: "input" in the
    core, "output" in the front end)."""
    _dropped_frames.warning("dropped an engine %s message that does not decode: %s: %s",
                            direction, type(error).__name__, error)
