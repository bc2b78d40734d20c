"""msgspec's msgpack for the engine's plain data, with numpy arrays as an extension.

Every message between Octavo's processes (front end and engine core, executor and workers)
is one of the engine's own dataclasses encoded here: msgspec handles dataclasses, enums,
sets and nested lists natively and is several times faster than pickle, and it decodes
into the declared types, so a peer cannot make the receiver build arbitrary objects. numpy
arrays (logprobs, grammar bitmasks) travel as an extension: dtype, shape and raw bytes.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

_NDARRAY_EXT = 1
_ARRAY_DECODER = msgspec.msgpack.Decoder(tuple[str, tuple[int, ...], bytes])


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        payload = (obj.dtype.str, obj.shape, np.ascontiguousarray(obj).tobytes())
        return msgspec.msgpack.Ext(_NDARRAY_EXT, msgspec.msgpack.encode(payload))
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in an Octavo message")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != _NDARRAY_EXT:
        raise ValueError(f"unknown msgpack extension {code}")
    dtype, shape, raw = _ARRAY_DECODER.decode(data)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _dec_hook(expected: type, obj: Any) -> Any:
    if expected is np.ndarray and isinstance(obj, np.ndarray):
        return obj
    raise NotImplementedError(f"cannot decode {type(obj).__name__} as {expected}")


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder(enc_hook=_enc_hook)


def decoder(message_type: Any) -> msgspec.msgpack.Decoder:
    """A decoder into ``message_type`` (a dataclass, a list of them, ...)."""
    return msgspec.msgpack.Decoder(message_type, ext_hook=_ext_hook, dec_hook=_dec_hook)
