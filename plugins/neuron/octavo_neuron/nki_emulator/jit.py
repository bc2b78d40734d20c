"""``nki.jit``: run a kernel in the emulator on host arrays.

Arguments that are torch tensors or numpy arrays become HBM tensors (copies, named after the
kernel's parameters); other arguments (ints, floats, tuples) pass through as the
compile-time constants they are on the device. The kernel returns what it allocated with
``nl.ndarray(..., buffer=nl.shared_hbm)``; those come back as numpy arrays (16-bit floats as
float32 holding the rounded values). An input the kernel stored into is copied back into
the caller's array, so in-place kernels (a KV-cache write) behave as on the device.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .dtypes import from_numpy, from_torch
from .errors import NkiRuleError
from .tensor import Tensor, hbm


def jit(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``@nki.jit`` or ``@nki.jit(...)``; the options (compiler modes) mean nothing here."""
    if func is None:
        return lambda f: jit(f, **options)
    return Kernel(func)


class Kernel:
    """A kernel function that runs in the emulator on every call (nothing is traced or
    cached: each call is the kernel executed eagerly on its inputs)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.signature = inspect.signature(func)
        lines, first = inspect.getsourcelines(func)
        offset = next(n for n, text in enumerate(lines) if text.lstrip().startswith("def "))
        self.def_line = (func.__code__.co_filename, first + offset)  # for errors on outputs
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.signature.bind(*args, **kwargs)
        inputs: list[tuple[Any, Tensor]] = []
        for name, value in bound.arguments.items():
            tensor = _to_hbm(value, name)
            if tensor is not None:
                inputs.append((value, tensor))
                bound.arguments[name] = tensor
        result = self.func(*bound.args, **bound.kwargs)
        for original, tensor in inputs:
            if tensor.written:
                _copy_back(original, tensor)
        return _outputs(result, self.def_line)


def _to_hbm(value: Any, name: str) -> Tensor | None:
    if isinstance(value, torch.Tensor):
        dtype = from_torch(value.dtype)
        data = value.detach().cpu()
        data = data.float() if dtype.is_float else data
        return Tensor(data.numpy().copy(), dtype, hbm, name)
    if isinstance(value, np.ndarray):
        return Tensor(value.copy(), from_numpy(value.dtype), hbm, name)
    return None


def _copy_back(original: Any, tensor: Tensor) -> None:
    if isinstance(original, torch.Tensor):
        original.copy_(torch.from_numpy(tensor.data).to(original.dtype))
    else:
        np.copyto(original, tensor.data.astype(original.dtype))


def _outputs(result: Any, kernel_line: tuple[str, int]) -> Any:
    if result is None:
        return None
    if isinstance(result, tuple):
        return tuple(_outputs(r, kernel_line) for r in result)
    if not isinstance(result, Tensor) or result.buffer.on_chip:
        raise NkiRuleError("kernel-output", result,
                           "a kernel returns HBM tensors (nl.ndarray(..., "
                           "buffer=nl.shared_hbm)), not on-chip tiles", kernel_line)
    return result.data.copy()
