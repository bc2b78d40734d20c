"""Tensor-parallel communication used by the layers when ``tp_size > 1``.

Kept in one place so that the executor that starts the tensor-parallel workers decides the
process group; today that is torch.distributed's default group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def check_divisible(what: str, size: int, tp_size: int) -> int:
    """``size // tp_size``, or a clear error when the layer cannot be split evenly."""
    if size % tp_size:
        raise ValueError(f"{what} ({size}) is not divisible by the tensor-parallel size "
                         f"({tp_size})")
    return size // tp_size


def all_reduce(partial: torch.Tensor) -> torch.Tensor:
    """Sum the partial results of all tensor-parallel ranks (in place)."""
    dist.all_reduce(partial)
    return partial


def all_gather_last_dim(shard: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Concatenate every rank's ``shard`` along the last dimension, in rank order."""
    shards = [torch.empty_like(shard) for _ in range(tp_size)]
    dist.all_gather(shards, shard.contiguous())
    return torch.cat(shards, dim=-1)
