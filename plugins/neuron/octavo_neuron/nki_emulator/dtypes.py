"""NKI's dtypes, held as numpy float32/int arrays with the value rounding of the real type.

ml_dtypes is not a dependency, so a bfloat16 value is a float32 rounded to bfloat16
(round-to-nearest-even, through torch); arithmetic then happens in float32 as it does in
the engines, and every result is rounded back to its tile's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int  # bytes on the device (for the SBUF/PSUM size rules)
    storage: type  # numpy dtype holding the values in the emulator
    torch_dtype: torch.dtype

    @property
    def is_float(self) -> bool:
        return np.issubdtype(self.storage, np.floating)

    def __repr__(self) -> str:
        return self.name


float32 = DType("float32", 4, np.float32, torch.float32)
bfloat16 = DType("bfloat16", 2, np.float32, torch.bfloat16)
float16 = DType("float16", 2, np.float32, torch.float16)
int32 = DType("int32", 4, np.int32, torch.int32)
int64 = DType("int64", 8, np.int64, torch.int64)  # only for inputs from the host

_BY_TORCH = {d.torch_dtype: d for d in (float32, bfloat16, float16, int32, int64)}
_BY_NUMPY = {np.dtype(np.float32): float32, np.dtype(np.float16): float16,
             np.dtype(np.int32): int32, np.dtype(np.int64): int64,
             np.dtype(np.float64): float32}  # NKI has no float64: host doubles run as fp32


def from_torch(dtype: torch.dtype) -> DType:
    if dtype not in _BY_TORCH:
        raise TypeError(f"the NKI emulator has no dtype for {dtype}")
    return _BY_TORCH[dtype]


def from_numpy(dtype: np.dtype) -> DType:
    if np.dtype(dtype) not in _BY_NUMPY:
        raise TypeError(f"the NKI emulator has no dtype for {dtype}")
    return _BY_NUMPY[np.dtype(dtype)]


def cast(data: np.ndarray, dtype: DType) -> np.ndarray:
    """``data`` as ``dtype`` values (rounded for the 16-bit floats) in its storage type."""
    if not dtype.is_float:
        return np.asarray(data).astype(dtype.storage)
    values = np.asarray(data, dtype=np.float32)
    if dtype.storage is np.float32 and dtype is not float32:
        rounded = torch.from_numpy(np.ascontiguousarray(values)).to(dtype.torch_dtype).float()
        return rounded.numpy()
    return values
