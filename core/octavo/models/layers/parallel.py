"""Tensor-parallel helpers of the layers: how a dimension splits, and the collectives.

A layer built without an explicit ``tp_rank``/``tp_size`` takes this process's from the
parallel state (``octavo.distributed.state``), which the worker process sets before it
builds the model; one rank (no communication) otherwise. The collectives go through the
state's tensor-parallel communicator, which the worker chose for its platform.
"""

from __future__ import annotations

import torch

from octavo.distributed.state import get_parallel_state


def check_divisible(what: str, size: int, tp_size: int) -> int:
    """``size // tp_size``, or a clear error when the layer cannot be split evenly."""
    if size % tp_size:
        raise ValueError(f"{what} ({size}) is not divisible by the tensor-parallel size "
                         f"({tp_size})")
    return size // tp_size


def resolve_tp(tp_rank: int | None, tp_size: int | None) -> tuple[int, int]:
    """The given rank and size, or this process's from the parallel state."""
    state = get_parallel_state()
    return (state.tp_rank if tp_rank is None else tp_rank,
            state.tp_size if tp_size is None else tp_size)


def kv_head_shards(num_kv_heads: int, tp_rank: int, tp_size: int) -> tuple[int, int, int]:
    """How key/value heads spread over ``tp_size`` ranks: ``(heads on this rank, this
    rank's shard index, number of shards)``.

    With at least as many KV heads as ranks each rank keeps ``num_kv_heads / tp_size`` of
    them; with fewer (grouped-query models at a large TP size) every rank keeps one, and
    ``tp_size / num_kv_heads`` consecutive ranks hold copies of the same head, as in vLLM.
    """
    if num_kv_heads >= tp_size:
        return check_divisible("key/value heads", num_kv_heads, tp_size), tp_rank, tp_size
    if tp_size % num_kv_heads:
        raise ValueError(f"the tensor-parallel size ({tp_size}) is neither a divisor nor a "
                         f"multiple of the key/value heads ({num_kv_heads})")
    replicas = tp_size // num_kv_heads
    return 1, tp_rank // replicas, num_kv_heads


def all_reduce(partial: torch.Tensor) -> torch.Tensor:
    """Sum the partial results of all tensor-parallel ranks (possibly in place)."""
    return get_parallel_state().tp_all_reduce(partial)


def all_gather_last_dim(shard: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``shard`` along the last dimension, in rank order."""
    return get_parallel_state().tp_all_gather(shard, -1)
