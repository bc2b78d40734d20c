"""What the torch wrappers share: a kernel's output as a torch tensor like its input."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

PMAX = 128  # partitions: the row tile of every kernel


def as_torch(value: Any, like: torch.Tensor) -> torch.Tensor:
    """A kernel output (a torch tensor from the real NKI, a numpy array from the emulator)
    in ``like``'s dtype and device."""
    tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
    return tensor.to(dtype=like.dtype, device=like.device)
