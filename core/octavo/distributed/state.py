"""``ParallelState``: this process's ranks and the groups the model layers talk to.

A model is built once per worker process; its layers shard themselves by the tensor-parallel
rank and size they find here when they are constructed, and call the tensor group's
collectives in their forward pass. The worker process sets the state (``init_distributed``)
before it builds the model; a process that never does (the in-process ``uni`` executor,
tests, the offline tools) sees one rank, and the layers do no communication at all.

Ranks are laid out as in vLLM: ``rank = pp_rank * tp_size + tp_rank``, so the ranks of one
pipeline stage are consecutive. The output rank, whose answer the executor reads, is the
first tensor rank of the last stage.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from octavo.distributed.rendezvous import rendezvous_store


@dataclass(frozen=True)
class RankInfo:
    """Where one worker sits: its global rank and its tensor and pipeline coordinates."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    @classmethod
    def of(cls, rank: int, tp_size: int, pp_size: int) -> RankInfo:
        if not 0 <= rank < tp_size * pp_size:
            raise ValueError(f"rank {rank} is outside a world of {tp_size * pp_size}")
        return cls(tp_rank=rank % tp_size, tp_size=tp_size, pp_rank=rank // tp_size,
                   pp_size=pp_size)

    @property
    def rank(self) -> int:
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_output_rank(self) -> bool:
        """The rank whose step output the executor reads."""
        return self.is_last_stage and self.tp_rank == 0

    def tp_group_ranks(self, pp_rank: int) -> list[int]:
        return [pp_rank * self.tp_size + t for t in range(self.tp_size)]

    def pp_group_ranks(self, tp_rank: int) -> list[int]:
        return [p * self.tp_size + tp_rank for p in range(self.pp_size)]


def output_rank(tp_size: int, pp_size: int) -> int:
    """The global rank of the first tensor rank of the last stage."""
    return (pp_size - 1) * tp_size


class TensorCommunicator(Protocol):
    """The collectives of one tensor-parallel group (gloo, NCCL, shared memory, ...)."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group's ranks; may reduce in place and return it."""
        ...

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim``, in rank order."""
        ...


@dataclass
class ProcessGroupCommunicator:
    """Collectives over a torch.distributed process group (the platform's backend)."""

    group: dist.ProcessGroup
    size: int

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor, group=self.group)
        return torch.cat(parts, dim=dim)


@dataclass
class ParallelState:
    """This process's ranks, its tensor group's communicator and its pipeline group."""

    info: RankInfo = field(default_factory=RankInfo)
    tp: TensorCommunicator | None = None  # None with one tensor rank
    pp_group: dist.ProcessGroup | None = None  # None with one stage
    # MoE layers shard whole experts over the tensor group instead of each expert's width.
    enable_expert_parallel: bool = False

    @property
    def tp_rank(self) -> int:
        return self.info.tp_rank

    @property
    def tp_size(self) -> int:
        return self.info.tp_size

    def tp_all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.tp is None else self.tp.all_reduce(tensor)

    def tp_all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return tensor if self.tp is None else self.tp.all_gather(tensor, dim)

    def send_to_next_stage(self, tensors: list[torch.Tensor]) -> None:
        """Send ``tensors`` to this tensor rank of the next stage (blocking)."""
        dst = self.info.rank + self.info.tp_size
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=dst, group=self.pp_group)

    def recv_from_previous_stage(self, shapes: list[tuple[int, ...]], dtype: torch.dtype,
                                 device: torch.device) -> list[torch.Tensor]:
        """Receive tensors of ``shapes`` from this tensor rank of the previous stage."""
        src = self.info.rank - self.info.tp_size
        received = []
        for shape in shapes:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(tensor, src=src, group=self.pp_group)
            received.append(tensor)
        return received


_state = ParallelState()


def get_parallel_state() -> ParallelState:
    """The state the layers built now shard by (one rank unless a worker set it)."""
    return _state


def set_parallel_state(state: ParallelState) -> None:
    global _state
    _state = state


@contextmanager
def parallel_state(state: ParallelState) -> Iterator[ParallelState]:
    """Build (or run) with ``state``, then restore the previous one (tests, proposers)."""
    previous = get_parallel_state()
    set_parallel_state(state)
    try:
        yield state
    finally:
        set_parallel_state(previous)


# Builds a tensor group's communicator: (group, rank in it, the process-group fallback).
CommunicatorFactory = Callable[[dist.ProcessGroup, int, TensorCommunicator], TensorCommunicator]


def init_distributed(info: RankInfo, backend: str, init_method: str, timeout_s: float, *,
                     tensor_communicator: CommunicatorFactory | None = None,
                     enable_expert_parallel: bool = False) -> ParallelState:
    """Join the engine's process group and make this rank's tensor and pipeline groups.

    Every rank creates every group, in the same order (torch.distributed requires it),
    then keeps the ones it is in. The tensor group's collectives run over the process group
    unless ``tensor_communicator`` (the platform's) makes something faster of it, which
    every rank of the group calls together. The state is set for this process and returned.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    store = rendezvous_store(init_method, info.rank, info.world_size, timeout)
    dist.init_process_group(backend=backend, store=store, rank=info.rank,
                            world_size=info.world_size, timeout=timeout)
    tp_group = pp_group = None
    for pp_rank in range(info.pp_size):
        group = dist.new_group(info.tp_group_ranks(pp_rank))
        if pp_rank == info.pp_rank:
            tp_group = group
    for tp_rank in range(info.tp_size):
        group = dist.new_group(info.pp_group_ranks(tp_rank))
        if tp_rank == info.tp_rank:
            pp_group = group
    tp: TensorCommunicator | None = None
    if info.tp_size > 1:
        assert tp_group is not None
        tp = ProcessGroupCommunicator(tp_group, info.tp_size)
        if tensor_communicator is not None:
            tp = tensor_communicator(tp_group, info.tp_rank, tp)
    state = ParallelState(info=info, tp=tp, pp_group=pp_group if info.pp_size > 1 else None,
                          enable_expert_parallel=enable_expert_parallel)
    set_parallel_state(state)
    return state
