"""Tensors in the three memories (HBM, SBUF, PSUM), their indexing, and the tile rules.

An HBM tensor is only reached through ``nl.load``/``nl.store``: indexing it gives an
``Access`` (the tensor and the indices), never data. Indexing an SBUF/PSUM tile gives a new
tile; assigning into one writes it. Every SBUF/PSUM tile is checked when it is made, so no
kernel can hold a tile the hardware could not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import DType, cast
from .errors import NkiRuleError

PMAX = 128  # partitions of SBUF and PSUM
PSUM_PARTITION_BYTES = 2048  # one PSUM bank per partition: 512 fp32
SBUF_PARTITION_BYTES = 192 * 1024


@dataclass(frozen=True)
class Buffer:
    name: str
    on_chip: bool


hbm = Buffer("HBM", on_chip=False)
shared_hbm = hbm
sbuf = Buffer("SBUF", on_chip=True)
psum = Buffer("PSUM", on_chip=True)


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition axis of a tile shape (axis 0 by default)."""


def par_dim(size: int) -> ParDim:
    return ParDim(size)


class Tensor:
    """Values (rounded to ``dtype``) in ``buffer``; ``name`` is the kernel argument's name."""

    def __init__(self, data: np.ndarray, dtype: DType, buffer: Buffer,
                 name: str | None = None, par_axis: int = 0) -> None:
        self.data = cast(data, dtype)
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.par_axis = par_axis
        self.written = False  # an HBM input that a kernel stored into is copied back
        if buffer.on_chip:
            _check_tile(self)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def __getitem__(self, key: Any) -> Access | Tensor:
        if not self.buffer.on_chip:
            return Access(self, key)
        indices, _ = resolve(key, self.shape)
        return Tensor(self.data[indices], self.dtype, self.buffer)

    def __setitem__(self, key: Any, value: Any) -> None:
        if not self.buffer.on_chip:
            raise NkiRuleError("hbm-direct-write", self,
                               "HBM is written only by nl.store, not by assignment")
        indices, shape = resolve(key, self.shape)
        self.data[indices] = np.broadcast_to(cast(values_of(value), self.dtype), shape)

    def reshape(self, shape: tuple[int, ...]) -> Tensor:
        """An HBM tensor's other view of the same memory (tiles cannot be reshaped)."""
        if self.buffer.on_chip:
            raise NkiRuleError("tile-reshape", self, "only HBM tensors can be reshaped")
        view = Tensor.__new__(Tensor)
        view.__dict__.update(self.__dict__, data=np.reshape(self.data, shape, copy=False),
                             base=self)  # a view or an error, never a silent copy
        return view

    def broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        """A [1, F] (or [P, 1]) tile copied across partitions (or the free axis)."""
        return Tensor(np.broadcast_to(self.data, shape).copy(), self.dtype, self.buffer)

    def mark_written(self) -> None:
        target: Tensor | None = self
        while target is not None:
            target.written = True
            target = target.__dict__.get("base")


@dataclass
class Access:
    """``hbm_tensor[key]``: what ``nl.load`` reads or ``nl.store`` writes."""

    tensor: Tensor
    key: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return resolve(self.key, self.tensor.shape)[1]


def values_of(value: Any) -> Any:
    """The numbers of a tile, index expression or scalar operand."""
    if isinstance(value, Tensor):
        if not value.buffer.on_chip:
            raise NkiRuleError("compute-on-hbm", value,
                               "engines compute on SBUF/PSUM tiles; nl.load it first")
        return value.data
    return value


def resolve(key: Any, shape: tuple[int, ...]
            ) -> tuple[tuple[np.ndarray, ...], tuple[int, ...]]:
    """``key`` as one broadcast index array per axis of ``shape``, and the result shape.

    Either every non-integer index is a slice (a rectangular block, as numpy's basic
    indexing) or every one is an index expression / integer tile (``nl.arange`` tiles, which
    broadcast together as numpy's advanced indexing). Mixing them is outside the subset.
    Indices are not clipped, so the bound rules see what the kernel asked for."""
    parts = list(key) if isinstance(key, tuple) else [key]
    parts = [values_of(p) if isinstance(p, Tensor) else p for p in parts]
    if len(parts) > len(shape):
        raise IndexError(f"{len(parts)} indices for a {len(shape)}-d tensor")
    has_array = any(isinstance(p, np.ndarray) and p.ndim > 0 for p in parts)
    if has_array:
        if len(parts) < len(shape) or any(isinstance(p, slice) for p in parts):
            raise NotImplementedError(
                "the emulator indexes with index expressions only when every axis has one "
                "(or an integer); use nl.arange for the other axes")
        arrays = [np.asarray(p, dtype=np.int64) for p in parts]
    else:
        parts += [slice(None)] * (len(shape) - len(parts))
        ranges = [np.arange(*_slice_bounds(p, size)) if isinstance(p, slice)
                  else np.asarray(int(p)) for p, size in zip(parts, shape)]
        num_sliced = sum(isinstance(p, slice) for p in parts)
        arrays, axis = [], 0
        for part, index in zip(parts, ranges):
            if isinstance(part, slice):
                index = index.reshape([1] * axis + [-1] + [1] * (num_sliced - axis - 1))
                axis += 1
            arrays.append(index)
    broadcast = np.broadcast_arrays(*arrays)
    return tuple(broadcast), broadcast[0].shape if broadcast else ()


def _slice_bounds(part: slice, size: int) -> tuple[int, int, int]:
    start = 0 if part.start is None else int(part.start)
    stop = size if part.stop is None else int(part.stop)
    return start, stop, 1 if part.step is None else int(part.step)


def check_bounds(indices: tuple[np.ndarray, ...], mask: np.ndarray | None,
                 tensor: Tensor, what: str) -> None:
    """Rule ``hbm-bounds``: every element a load/store touches (mask true) is inside."""
    for axis, (index, size) in enumerate(zip(indices, tensor.shape)):
        used = index if mask is None else index[mask]
        if used.size and (used.min() < 0 or used.max() >= size):
            raise NkiRuleError(
                "hbm-bounds", tensor,
                f"{what} reaches index {int(used.min())}..{int(used.max())} on axis {axis} "
                f"of size {size} (out of bounds; mask the edge tile)")


def _check_tile(tile: Tensor) -> None:
    """Rules ``partition-dim``, ``psum-size`` and ``sbuf-size`` for an on-chip tile."""
    shape = tile.shape
    if not shape:
        return
    partitions = shape[tile.par_axis]
    if partitions > PMAX:
        raise NkiRuleError("partition-dim", tile,
                           f"partition dimension (axis {tile.par_axis}) is {partitions} > "
                           f"{PMAX} partitions")
    free_bytes = int(np.prod(shape[tile.par_axis + 1:], dtype=np.int64)) * tile.dtype.itemsize
    limit = PSUM_PARTITION_BYTES if tile.buffer is psum else SBUF_PARTITION_BYTES
    if free_bytes > limit:
        rule = "psum-size" if tile.buffer is psum else "sbuf-size"
        raise NkiRuleError(rule, tile, f"{free_bytes} bytes per partition > {limit} bytes of "
                                       f"{tile.buffer.name} per partition")
