"""Prompt embeddings as a prompt: checking what a user gives - a tensor to
``LLM.generate({"prompt_embeds": tensor})``, or the tensor the server decoded from a
request's ``prompt_embeds`` - and turning it into the engine's plain data.

The engine keeps every prompt embedding as float32 numpy: the worker boundary carries no
torch tensors, numpy has no bfloat16, and float32 holds float16 and bfloat16 values
exactly. The worker casts the rows to the model's dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def check_prompt_embeds(value: Any, hidden_size: int) -> np.ndarray:
    """``value`` (a torch tensor or numpy array) as a float32 C-contiguous copy
    ``[num_tokens, hidden_size]``; ``ValueError`` naming the problem otherwise: not 2-D, no
    rows, another hidden size, not a float dtype, a NaN or infinity."""
    array = _as_float32(value)
    if array.ndim != 2:
        raise ValueError(f"prompt_embeds must be a 2-D [num_tokens, hidden_size] tensor; got "
                         f"shape {list(array.shape)}")
    if array.shape[0] == 0:
        raise ValueError("prompt_embeds has no rows; a prompt needs at least one")
    if array.shape[1] != hidden_size:
        raise ValueError(f"prompt_embeds has hidden size {array.shape[1]}; the model's "
                         f"hidden_size is {hidden_size}")
    finite = np.isfinite(array).all(axis=1)
    if not finite.all():
        raise ValueError(f"prompt_embeds holds non-finite values (NaN or infinity), first in "
                         f"row {int(np.argmin(finite))}")
    return array


def _as_float32(value: Any) -> np.ndarray:
    """A float32 copy of the tensor (a copy: the user may change theirs afterwards, and the
    prefix cache hashes these bytes)."""
    import torch  # not at import: the server's front end loads this before spawning

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"prompt_embeds must be {', '.join(FLOAT_DTYPES)}; got {dtype}")
        return value.detach().to("cpu", torch.float32).contiguous().numpy().copy()
    if isinstance(value, np.ndarray):
        if value.dtype.name not in FLOAT_DTYPES:
            raise ValueError(f"prompt_embeds must be {', '.join(FLOAT_DTYPES)}; got "
                             f"{value.dtype.name}")
        return np.array(value, dtype=np.float32, order="C")
    raise ValueError(f"prompt_embeds must be a torch tensor or a numpy array, not "
                     f"{type(value).__name__}")
