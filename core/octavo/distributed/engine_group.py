"""Process groups that span data-parallel engines (expert parallelism across engines).

An engine's workers already form a torch.distributed world of their own (tensor, sequence,
pipeline groups: ``octavo.distributed.state``), and a process has only one default world.
The groups here sit beside it, built directly on a store (``ProcessGroupGloo`` /
``ProcessGroupNCCL``), so no engine's own groups change:

- the **lockstep group**: one rank per engine core process, in which the engines agree
  each step whether any of them has work (``octavo.engine.dp_lockstep``);
- the **expert group**: one rank per worker of every engine (``engine * tp_size +
  tp_rank``), over which the MoE layers dispatch tokens to their experts and combine the
  results (``octavo.models.layers.expert_dispatch``).

Both rendezvous on one ``TCPStore``, served by engine 0's core process on
``data_parallel_address:data_parallel_master_port`` (bound to that address only), each
under its own key prefix.

A failed collective of the expert group (a worker of another engine is gone, so gloo's
connections to it closed) raises ``ExpertGroupBroken``, which ends the worker that sees it
(``octavo.executor.ranks.run_call``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Protocol, cast

import torch
import torch.distributed as dist

from octavo.distributed.rendezvous import rendezvous_store


class ExpertGroupBroken(RuntimeError):
    """A collective of the expert group failed: the group cannot be used again.

    Fatal to the worker, not one step's error: with tensor parallelism, this worker's
    peers in its own engine may already wait in the step's next all-reduce for it (the
    all-to-all returns on each rank as soon as its own rows arrived), and would wait there
    for the all-reduce's timeout. The worker's exit makes its executor stop the engine's
    other workers at once (as with any worker that dies)."""


class Collectives(Protocol):
    """What the groups here call of a gloo / NCCL backend object (torch's stubs omit it)."""

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      ) -> dist.Work: ...

    def allreduce(self, tensors: list[torch.Tensor],
                  opts: dist.AllreduceOptions) -> dist.Work: ...


def engine_store(address: str, port: int, serve: bool, timeout_s: float) -> dist.Store:
    """The engines' shared store: served here when ``serve`` (engine 0's core), else a
    client of it."""
    return rendezvous_store(f"tcp://{address}:{port}", 0 if serve else 1, None,
                            datetime.timedelta(seconds=timeout_s))


def new_group(store: dist.Store, prefix: str, rank: int, size: int, backend: str,
              timeout_s: float) -> Collectives:
    """A group of ``size`` ranks under ``prefix`` in ``store`` (gloo, or NCCL on CUDA
    devices): the backend object itself, whose collectives are called directly (it is in
    no default world)."""
    prefixed = dist.PrefixStore(prefix, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return cast(Collectives, dist.ProcessGroupNCCL(prefixed, rank, size, options))
    return cast(Collectives, dist.ProcessGroupGloo(prefixed, rank, size, timeout))


def join_expert_group(address: str, port: int, rank: int, size: int, backend: str,
                      timeout_s: float) -> ExpertGroup:
    """This worker's place in the expert group of every engine's workers (every worker
    of every engine calls it at start)."""
    store = engine_store(address, port, serve=False, timeout_s=timeout_s)
    return ExpertGroup(new_group(store, "experts/", rank, size, backend, timeout_s),
                       rank, size)


@dataclass
class ExpertGroup:
    """The expert-parallel group of every engine's workers, and what it has sent."""

    group: Collectives
    rank: int
    size: int
    # Bytes this rank handed to all-to-alls for other ranks (its own share excluded):
    # counted, for benchmarks/expert_parallel.py.
    bytes_sent: int = field(default=0)

    def exchange_counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """``send_counts [size]`` (rows for each rank) -> the rows each rank will send here."""
        received = torch.empty_like(send_counts)
        self._wait(self.group.alltoall_base(received, send_counts, [1] * self.size,
                                            [1] * self.size))
        return received

    def all_to_all(self, tensor: torch.Tensor, send_counts: list[int],
                   recv_counts: list[int]) -> torch.Tensor:
        """Rows ``[sum(send_counts[:j]), ...)`` of ``tensor`` go to rank ``j``; the rows every
        rank sent here, in rank order (variable counts, both sides known beforehand)."""
        tensor = tensor.contiguous()
        received = tensor.new_empty((sum(recv_counts), *tensor.shape[1:]))
        self._wait(self.group.alltoall_base(received, tensor, recv_counts, send_counts))
        row_bytes = tensor[:1].numel() * tensor.element_size() if len(tensor) else 0
        self.bytes_sent += (sum(send_counts) - send_counts[self.rank]) * row_bytes
        return received

    def _wait(self, work: dist.Work) -> None:
        try:
            work.wait()
        except RuntimeError as exc:  # gloo's and NCCL's errors (DistBackendError included)
            raise ExpertGroupBroken(
                f"expert-group rank {self.rank} of {self.size}: the expert group is broken "
                f"(a worker of another engine died?): {exc}") from exc
