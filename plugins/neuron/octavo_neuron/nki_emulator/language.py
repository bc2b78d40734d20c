"""``nki.language``: tiles, loads/stores between HBM and SBUF, and the tile arithmetic.

Memory that a kernel has not written is undefined on the device; the emulator fills it (and
the masked-off elements of a masked load) with NaN, so a kernel that reads it fails its
numeric tests instead of passing by luck.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from . import isa
from .compute import binary, elementwise, reduction, unary
from .dtypes import DType, bfloat16, cast, float16, float32, int32
from .errors import NkiRuleError
from .tensor import (
    PMAX,
    Access,
    ParDim,
    Tensor,
    check_bounds,
    hbm,
    par_dim,
    psum,
    resolve,
    sbuf,
    shared_hbm,
)

__all__ = ["add", "affine_range", "arange", "bfloat16", "copy", "cos", "divide", "exp",
           "float16", "float32", "full", "hbm", "int32", "load", "matmul", "max", "maximum",
           "minimum", "multiply", "ndarray", "negative", "par_dim", "psum", "rsqrt", "sbuf",
           "sequential_range", "shared_hbm", "sigmoid", "silu", "sin", "sqrt", "static_range",
           "store", "subtract", "sum", "tile_size", "transpose", "where", "zeros"]

tile_size = SimpleNamespace(pmax=PMAX, psum_fmax=isa.MOVING_FMAX,
                            gemm_stationary_fmax=isa.STATIONARY_FMAX,
                            gemm_moving_fmax=isa.MOVING_FMAX)


def affine_range(*args: int) -> range:
    """Iterations without a loop-carried dependency (the compiler may run them in any order;
    the emulator runs them in order)."""
    return range(*args)


sequential_range = affine_range
static_range = affine_range


def arange(*args: int) -> np.ndarray:
    """An index expression: ``nl.arange(128)[:, None]`` is a partition index."""
    return np.arange(*args)


def _undefined(shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    return np.full(shape, np.nan if dtype.is_float else 0, dtype=dtype.storage)


def ndarray(shape: tuple[int, ...], dtype: DType, buffer: Any = sbuf,
            name: str | None = None) -> Tensor:
    """A new tensor with undefined contents (NaN); in HBM it is a kernel output."""
    par_axis = next((i for i, size in enumerate(shape) if isinstance(size, ParDim)), 0)
    return Tensor(_undefined(tuple(int(s) for s in shape), dtype), dtype, buffer, name,
                  par_axis)


def full(shape: tuple[int, ...], fill_value: Any, dtype: DType, buffer: Any = sbuf,
         name: str | None = None) -> Tensor:
    tile = ndarray(shape, dtype, buffer, name)
    tile.data[...] = fill_value
    return tile


def zeros(shape: tuple[int, ...], dtype: DType, buffer: Any = sbuf,
          name: str | None = None) -> Tensor:
    return full(shape, 0, dtype, buffer, name)


def _hbm_access(target: Any, what: str) -> Access:
    """Rule ``load-store-hbm``: nl.load/nl.store move data between HBM and SBUF only."""
    if isinstance(target, Tensor) and not target.buffer.on_chip:
        return Access(target, ())
    if not isinstance(target, Access):
        raise NkiRuleError("load-store-hbm", target,
                           f"{what} needs an HBM tensor (or an indexed one), got an on-chip "
                           f"tile or another object")
    return target


def _mask_of(mask: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    if mask is None:
        return None
    return np.broadcast_to(np.asarray(getattr(mask, "data", mask), dtype=bool), shape)


def load(src: Any, mask: Any = None, dtype: DType | None = None) -> Tensor:
    """HBM -> a new SBUF tile (rule ``hbm-bounds`` on the elements the mask keeps)."""
    access = _hbm_access(src, "nl.load")
    indices, shape = resolve(access.key, access.tensor.shape)
    keep = _mask_of(mask, shape)
    check_bounds(indices, keep, access.tensor, "load")
    if keep is not None:
        indices = tuple(np.where(keep, index, 0) for index in indices)
    data = access.tensor.data[indices]
    if keep is not None:
        data = np.where(keep, data, _undefined(shape, access.tensor.dtype))
    return Tensor(data, dtype or access.tensor.dtype, sbuf)


def store(dst: Any, value: Tensor, mask: Any = None) -> None:
    """An SBUF tile -> HBM. Rules ``store-source`` (the value must be an SBUF tile: a PSUM
    result is first copied to SBUF), ``store-shape`` and ``hbm-bounds``."""
    access = _hbm_access(dst, "nl.store")
    if not isinstance(value, Tensor) or value.buffer is not sbuf:
        held = value.buffer.name if isinstance(value, Tensor) else type(value).__name__
        raise NkiRuleError("store-source", value,
                           f"nl.store writes HBM from an SBUF tile, not from {held}")
    indices, shape = resolve(access.key, access.tensor.shape)
    if value.shape != shape:
        raise NkiRuleError("store-shape", value,
                           f"tile shape {list(value.shape)} does not match the destination "
                           f"{list(shape)} of {access.tensor.name or 'the HBM tensor'}")
    keep = _mask_of(mask, shape)
    check_bounds(indices, keep, access.tensor, "store")
    values = cast(value.data, access.tensor.dtype)
    if keep is None:
        access.tensor.data[indices] = values
    else:
        access.tensor.data[tuple(index[keep] for index in indices)] = values[keep]
    access.tensor.mark_written()


exp = unary("exp", np.exp)
sqrt = unary("sqrt", np.sqrt)
rsqrt = unary("rsqrt", lambda x: 1.0 / np.sqrt(x))
sigmoid = unary("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)))
silu = unary("silu", lambda x: x / (1.0 + np.exp(-x)))
negative = unary("negative", np.negative)
sin = unary("sin", np.sin)
cos = unary("cos", np.cos)
copy = unary("copy", lambda x: x)  # also how a PSUM result reaches SBUF
add = binary("add", np.add, np.sum)
subtract = binary("subtract", np.subtract)
multiply = binary("multiply", np.multiply, np.prod)
divide = binary("divide", np.divide)
maximum = binary("maximum", np.maximum, np.max)
minimum = binary("minimum", np.minimum, np.min)
max = reduction("max", np.max)  # NKI's names, shadowing the builtins in this module
sum = reduction("sum", np.sum)


def where(condition: Any, x: Any, y: Any, dtype: DType | None = None) -> Tensor:
    """``x`` where ``condition`` (a tile or an index expression) holds, else ``y``."""
    return elementwise(lambda c, a, b: np.where(np.asarray(c, dtype=bool), a, b),
                       [condition, x, y], dtype)


def matmul(x: Tensor, y: Tensor, transpose_x: bool = False) -> Tensor:
    """``x @ y`` (or ``x.T @ y`` with ``transpose_x``) into PSUM; ``x`` [M, K] is transposed
    on the Tensor Engine first, so every ``nc_matmul`` rule applies to both forms."""
    stationary = x if transpose_x else copy(isa.nc_transpose(x), dtype=x.dtype)
    return isa.nc_matmul(stationary, y)


def transpose(x: Tensor) -> Tensor:
    return isa.nc_transpose(x)
