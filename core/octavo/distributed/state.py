"""``ParallelState``: this process's ranks and the groups the model layers talk to.

A model is built once per worker process; its layers shard themselves by the tensor-parallel
rank and size they find here when they are constructed, and call the tensor group's
collectives in their forward pass. The worker process sets the state (``init_distributed``)
before it builds the model; a process that never does (the in-process ``uni`` executor,
tests, the offline tools) sees one rank, and the layers do no communication at all.

Ranks are laid out as in vLLM: ``rank = pp_rank * tp_size + tp_rank``, so the ranks of one
pipeline stage are consecutive. Ulysses sequence parallelism (SP) sits between the two:
``rank = (pp_rank * sp_size + sp_rank) * tp_size + tp_rank``, so the tensor ranks of one
sequence shard are consecutive. The output rank, whose answer the executor reads, is the
first tensor and sequence rank of the last stage.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from octavo.distributed.engine_group import ExpertGroup
from octavo.distributed.rendezvous import rendezvous_store


@dataclass(frozen=True)
class RankInfo:
    """Where one worker sits: its global rank and its tensor, sequence and pipeline
    coordinates."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    sp_rank: int = 0
    sp_size: int = 1

    @classmethod
    def of(cls, rank: int, tp_size: int, pp_size: int, sp_size: int = 1) -> RankInfo:
        world = tp_size * sp_size * pp_size
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a world of {world}")
        return cls(tp_rank=rank % tp_size, tp_size=tp_size,
                   pp_rank=rank // (tp_size * sp_size), pp_size=pp_size,
                   sp_rank=rank // tp_size % sp_size, sp_size=sp_size)

    @property
    def rank(self) -> int:
        return (self.pp_rank * self.sp_size + self.sp_rank) * self.tp_size + self.tp_rank

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: tensor x sequence."""
        return self.tp_size * self.sp_size

    @property
    def world_size(self) -> int:
        return self.stage_size * self.pp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_output_rank(self) -> bool:
        """The rank whose step output the executor reads."""
        return self.is_last_stage and self.tp_rank == 0 and self.sp_rank == 0

    def _at(self, tp_rank: int, sp_rank: int, pp_rank: int) -> int:
        return RankInfo(tp_rank, self.tp_size, pp_rank, self.pp_size, sp_rank,
                        self.sp_size).rank

    def tp_groups(self) -> list[list[int]]:
        """Every tensor group's ranks (one per stage and sequence shard)."""
        return [[self._at(t, s, p) for t in range(self.tp_size)]
                for p in range(self.pp_size) for s in range(self.sp_size)]

    def sp_groups(self) -> list[list[int]]:
        """Every sequence group's ranks (one per stage and tensor rank)."""
        return [[self._at(t, s, p) for s in range(self.sp_size)]
                for p in range(self.pp_size) for t in range(self.tp_size)]

    def pp_groups(self) -> list[list[int]]:
        """Every pipeline group's ranks (one per tensor rank and sequence shard)."""
        return [[self._at(t, s, p) for p in range(self.pp_size)]
                for s in range(self.sp_size) for t in range(self.tp_size)]


def output_rank(tp_size: int, pp_size: int, sp_size: int = 1) -> int:
    """The global rank of the first tensor and sequence rank of the last stage."""
    return (pp_size - 1) * sp_size * tp_size


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

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """Send chunk ``j`` of ``tensor``'s first dimension to rank ``j``; the chunks every
        rank sent this one, concatenated in rank order (same shape as ``tensor``)."""
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        dist.all_to_all_single(received, tensor, group=self.group)
        return received


@dataclass
class ParallelState:
    """This process's ranks, its tensor group's communicator and its pipeline group."""

    info: RankInfo = field(default_factory=RankInfo)
    tp: TensorCommunicator | None = None  # None with one tensor rank
    pp_group: dist.ProcessGroup | None = None  # None with one stage
    sp: ProcessGroupCommunicator | None = None  # None with one sequence shard
    # MoE layers shard whole experts over the tensor group instead of each expert's width.
    enable_expert_parallel: bool = False
    # Every engine's workers, with data-parallel expert parallelism (else None): the MoE
    # layers hold whole experts over it and move tokens to them by all-to-all.
    ep: ExpertGroup | None = None

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
        dst = self.info.rank + self.info.stage_size
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=dst, group=self.pp_group)

    def recv_from_previous_stage(self, shapes: list[tuple[int, ...]], dtype: torch.dtype,
                                 device: torch.device) -> list[torch.Tensor]:
        """Receive tensors of ``shapes`` from this tensor rank of the previous stage."""
        src = self.info.rank - self.info.stage_size
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
    """Join the engine's process group and make this rank's tensor, sequence and pipeline
    groups.

    Every rank creates every group, in the same order (torch.distributed requires it),
    then keeps the ones it is in. The tensor group's collectives run over the process group
    unless ``tensor_communicator`` (the platform's) makes something faster of it, which
    every rank of the group calls together. The state is set for this process and returned.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    store = rendezvous_store(init_method, info.rank, info.world_size, timeout)
    dist.init_process_group(backend=backend, store=store, rank=info.rank,
                            world_size=info.world_size, timeout=timeout)
    tp_group = _new_groups(info.tp_groups(), info.rank)
    sp_group = _new_groups(info.sp_groups(), info.rank) if info.sp_size > 1 else None
    pp_group = _new_groups(info.pp_groups(), info.rank)
    tp: TensorCommunicator | None = None
    if info.tp_size > 1:
        tp = ProcessGroupCommunicator(tp_group, info.tp_size)
        if tensor_communicator is not None:
            tp = tensor_communicator(tp_group, info.tp_rank, tp)
    sp = None if sp_group is None else ProcessGroupCommunicator(sp_group, info.sp_size)
    state = ParallelState(info=info, tp=tp, pp_group=pp_group if info.pp_size > 1 else None,
                          sp=sp, enable_expert_parallel=enable_expert_parallel)
    set_parallel_state(state)
    return state


def _new_groups(groups: list[list[int]], rank: int) -> dist.ProcessGroup:
    """Create every group of one kind (every rank creates each, in the same order, as
    torch.distributed requires); the one holding ``rank``."""
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    assert mine is not None, f"rank {rank} is in no group of {groups}"
    return mine
