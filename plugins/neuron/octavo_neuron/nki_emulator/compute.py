"""The engines' elementwise and reduction arithmetic: float32 inside, the tile's dtype out.

Operands are SBUF/PSUM tiles, scalars or index expressions (numpy arrays built from
``nl.arange``). Tiles must agree on the partition dimension (rule ``partition-broadcast``:
an engine lane only sees its own partition, so a [1, F] tile is not silently spread over
128 partitions; use ``tile.broadcast_to``); free dimensions broadcast as in numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .dtypes import DType, float32
from .errors import NkiRuleError
from .tensor import Tensor, sbuf, values_of


def result_dtype(operands: Sequence[Any], dtype: DType | None) -> DType:
    """``dtype`` if given, else float32 if any tile is float32, else the first tile's."""
    if dtype is not None:
        return dtype
    tiles = [op for op in operands if isinstance(op, Tensor)]
    if not tiles or any(t.dtype is float32 for t in tiles):
        return float32
    return tiles[0].dtype


def _check_partitions(operands: Sequence[Any]) -> None:
    tiles = [op for op in operands if isinstance(op, Tensor) and op.shape]
    for tile in tiles[1:]:
        if tile.buffer.on_chip and tile.shape[0] != tiles[0].shape[0]:
            raise NkiRuleError("partition-broadcast", tile,
                               f"{tile.shape[0]} partitions against {tiles[0].shape[0]} of "
                               f"the other operand (tiles must agree on axis 0)")


def elementwise(fn: Callable[..., Any], operands: Sequence[Any], dtype: DType | None,
                ) -> Tensor:
    """``fn`` of the operands' values into a new SBUF tile (engines write SBUF)."""
    values = [values_of(op) for op in operands]  # HBM operands fail first
    _check_partitions(operands)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        result = fn(*values)
    return Tensor(np.asarray(result), result_dtype(operands, dtype), sbuf)


def reduce(np_reduce: Callable[..., Any], data: Tensor, axis: int | Sequence[int],
           dtype: DType | None, keepdims: bool) -> Tensor:
    """Rule ``reduce-partition``: engines reduce along free axes only (axis 0 is the
    partition axis; reduce across partitions with a matmul or a transpose)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if any(a % data.data.ndim == 0 for a in axes):
        raise NkiRuleError("reduce-partition", data,
                           f"reduction over axis {axis} includes the partition axis 0")
    result = np_reduce(values_of(data), axis=axes, keepdims=keepdims)
    return Tensor(np.asarray(result), result_dtype([data], dtype), sbuf)


def unary(name: str, np_fn: Callable[[np.ndarray], np.ndarray]) -> Callable[..., Tensor]:
    def op(x: Any, dtype: DType | None = None) -> Tensor:
        return elementwise(np_fn, [x], dtype)

    op.__name__ = op.__qualname__ = name
    op.np_fn = np_fn  # type: ignore[attr-defined]
    return op


def binary(name: str, np_fn: Callable[[Any, Any], Any],
           np_reduce: Callable[..., Any] | None = None) -> Callable[..., Tensor]:
    def op(x: Any, y: Any, dtype: DType | None = None) -> Tensor:
        return elementwise(np_fn, [x, y], dtype)

    op.__name__ = op.__qualname__ = name
    op.np_fn = np_fn  # type: ignore[attr-defined]
    op.np_reduce = np_reduce  # type: ignore[attr-defined]
    return op


def reduction(name: str, np_reduce: Callable[..., Any]) -> Callable[..., Tensor]:
    def op(x: Tensor, axis: int | Sequence[int], dtype: DType | None = None,
           keepdims: bool = False) -> Tensor:
        return reduce(np_reduce, x, axis, dtype, keepdims)

    op.__name__ = op.__qualname__ = name
    op.np_reduce = np_reduce  # type: ignore[attr-defined]
    return op


def np_fn_of(op: Any) -> Callable[..., Any]:
    if not hasattr(op, "np_fn"):
        raise TypeError(f"{op!r} is not an NKI elementwise op of this emulator")
    return op.np_fn


def np_reduce_of(op: Any) -> Callable[..., Any]:
    if getattr(op, "np_reduce", None) is None:
        raise TypeError(f"{op!r} is not an NKI reduction op of this emulator")
    return op.np_reduce
