"""``nki.isa``: the engine instructions the kernels use (Tensor, Vector and Scalar engines)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .compute import elementwise, np_fn_of, np_reduce_of, reduce
from .dtypes import DType, float32, int32
from .errors import NkiRuleError
from .tensor import PMAX, Tensor, psum, sbuf

MOVING_FMAX = 512  # free size of the moving operand (one PSUM bank of fp32)
STATIONARY_FMAX = 128


def _sbuf_operand(tile: Any, role: str) -> Tensor:
    """Rule ``matmul-operand-buffer``: the Tensor Engine reads its operands from SBUF."""
    if not isinstance(tile, Tensor) or tile.buffer is not sbuf:
        where = tile.buffer.name if isinstance(tile, Tensor) else type(tile).__name__
        raise NkiRuleError("matmul-operand-buffer", tile,
                           f"the {role} operand is in {where}; matmul operands must be SBUF "
                           f"tiles (nl.load HBM data, copy PSUM results to SBUF)")
    if tile.data.ndim != 2:
        raise NkiRuleError("matmul-operand-buffer", tile, f"the {role} operand is not 2-d")
    return tile


def nc_matmul(stationary: Tensor, moving: Tensor) -> Tensor:
    """``stationary.T @ moving`` into a new fp32 PSUM tile [M, N]: the contraction runs over
    the partition axis K of both operands (stationary [K, M], moving [K, N]).

    Rules ``matmul-contraction`` (K equal on both sides and <= 128), ``matmul-size``
    (M <= 128, N <= 512)."""
    stationary = _sbuf_operand(stationary, "stationary")
    moving = _sbuf_operand(moving, "moving")
    (k, m), (k_moving, n) = stationary.shape, moving.shape
    if k != k_moving or k > PMAX:
        raise NkiRuleError("matmul-contraction", moving,
                           f"contraction (partition) sizes {k} (stationary) and {k_moving} "
                           f"(moving) must agree and be <= {PMAX}")
    if m > STATIONARY_FMAX:
        raise NkiRuleError("matmul-size", stationary,
                           f"stationary free size {m} > {STATIONARY_FMAX}")
    if n > MOVING_FMAX:
        raise NkiRuleError("matmul-size", moving, f"moving free size {n} > {MOVING_FMAX}")
    result = stationary.data.astype(np.float32).T @ moving.data.astype(np.float32)
    return Tensor(result, float32, psum)


def nc_transpose(data: Tensor) -> Tensor:
    """``data.T`` [F, P] into PSUM, through the Tensor Engine (rule ``transpose-size``:
    both axes <= 128, the transposed free axis becomes the partition axis)."""
    if not isinstance(data, Tensor) or not data.buffer.on_chip or data.data.ndim != 2:
        raise NkiRuleError("transpose-size", data, "nc_transpose takes a 2-d on-chip tile")
    if max(data.shape) > PMAX:
        raise NkiRuleError("transpose-size", data, f"both axes must be <= {PMAX}")
    return Tensor(data.data.T.copy(), data.dtype, psum)


def activation(op: Callable[..., Any], data: Tensor, bias: Tensor | None = None,
               scale: Any = 1.0, dtype: DType | None = None) -> Tensor:
    """Scalar Engine: ``op(data * scale + bias)``; ``bias`` a [P, 1] tile."""
    np_fn = np_fn_of(op)
    operands = [data, scale] + ([] if bias is None else [bias])

    def fn(x: Any, s: Any, b: Any = 0.0) -> Any:
        return np_fn(np.asarray(x, dtype=np.float32) * s + b)

    return elementwise(fn, operands, dtype or data.dtype)


def tensor_reduce(op: Callable[..., Any], data: Tensor, axis: int | Sequence[int],
                  dtype: DType | None = None, keepdims: bool = False) -> Tensor:
    return reduce(np_reduce_of(op), data, axis, dtype, keepdims)


def tensor_tensor(data1: Tensor, data2: Tensor, op: Callable[..., Any],
                  dtype: DType | None = None) -> Tensor:
    return elementwise(np_fn_of(op), [data1, data2], dtype)


def tensor_scalar(data: Tensor, op0: Callable[..., Any], operand0: Any, reverse0: bool = False,
                  op1: Callable[..., Any] | None = None, operand1: Any = None,
                  reverse1: bool = False, dtype: DType | None = None) -> Tensor:
    """``(data op0 operand0) op1 operand1``; ``reverse`` swaps an op's operands."""

    def apply(op: Callable[..., Any], x: Any, operand: Any, reverse: bool) -> Any:
        fn = np_fn_of(op)
        return fn(operand, x) if reverse else fn(x, operand)

    def fn(x: Any, a: Any, b: Any = None) -> Any:
        x = apply(op0, x, a, reverse0)
        return x if op1 is None else apply(op1, x, b, reverse1)

    operands = [data, operand0] + ([] if op1 is None else [operand1])
    return elementwise(fn, operands, dtype or data.dtype)


def iota(expr: Any, dtype: DType = int32) -> Tensor:
    """An index expression (``nl.arange`` arithmetic) materialised as an SBUF tile."""
    return Tensor(np.asarray(expr), dtype, sbuf)
