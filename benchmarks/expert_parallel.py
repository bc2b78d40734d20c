"""Expert parallelism's two schemes on two ranks, one MoE layer (8 experts, top-2), gloo on
loopback: what each rank sends per layer per token, and the layer's time.

- ``tp2-ep`` (one engine at ``-tp 2 --enable-expert-parallel``): both ranks hold every
  token of the step; each runs its 4 experts on the tokens routed to them, and the partial
  outputs ``[T, H]`` are all-reduced.
- ``dp2-ep`` (``-dp 2 --enable-expert-parallel``): each rank (engine) holds half the
  step's tokens; the routed rows go to the rank holding their expert by all-to-all (after
  a count exchange), the results come back by a second one
  (``octavo.models.layers.expert_dispatch``).

Bytes are counted, not estimated, for the all-to-alls: ``ExpertGroup.bytes_sent``, the rows
(and their int64 expert ids) each rank handed the collective for the other rank. For the
all-reduce the count is of the tensor handed to it, times 2 (n - 1) / n = 1 at n = 2, what a
ring all-reduce sends per rank (gloo picks its own algorithm; the payload is exact).
Step time is the median over ``--repeats`` layer calls of the slower rank, attention and
everything else of a step left out. The shapes: ``tiny`` (the tests' Mixtral: hidden 64,
expert intermediate 96) and ``large`` (hidden 1024, intermediate 2816).

    .venv/bin/python benchmarks/expert_parallel.py                     # tokens 16 and 256
    .venv/bin/python benchmarks/expert_parallel.py --tokens 4 --repeats 3 --shapes tiny
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from octavo.distributed.engine_group import ExpertGroup, new_group
from octavo.distributed.state import ParallelState, ProcessGroupCommunicator, parallel_state
from octavo.models.layers.moe import FusedMoE, select_experts
from octavo.net import free_port

SHAPES = {"tiny": (64, 96), "large": (1024, 2816)}  # hidden, expert intermediate
NUM_EXPERTS, TOP_K, RANKS = 8, 2, 2


@dataclass
class Row:
    shape: str
    scheme: str
    tokens: int
    bytes_per_token: float  # sent by all ranks, per layer, per token of the step
    layer_ms: float


class CountingCommunicator(ProcessGroupCommunicator):
    """The tensor group's all-reduce, counting the bytes handed to it."""

    handed: int = 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.handed += tensor.numel() * tensor.element_size()
        return super().all_reduce(tensor)


def timed(call, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """The median of ``repeats`` calls (ms), each starting together on both ranks."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        call()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed) * 1000)
    return statistics.median(times)


def moe(hidden: int, intermediate: int, rank: int, state: ParallelState) -> FusedMoE:
    """This rank's experts (seed 0: the same random weights for every scheme): a tensor
    rank of one engine, or (``state.ep`` set) the one worker of engine ``rank``."""
    tp_rank, tp_size = (0, 1) if state.ep is not None else (rank, RANKS)
    with parallel_state(state):
        layer = FusedMoE(NUM_EXPERTS, hidden, intermediate, tp_rank=tp_rank, tp_size=tp_size,
                         enable_expert_parallel=True)
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(NUM_EXPERTS, *p.shape[1:], generator=generator) * 0.05
            for p in (layer.w13_weight, layer.w2_weight)]
    first = layer.local_experts.start
    for param, weights in zip((layer.w13_weight, layer.w2_weight), full):
        param.data.copy_(weights[first:first + len(layer.local_experts)])
    return layer


def measure(rank: int, shape: str, tokens: int, repeats: int, store: dist.Store,
            ) -> list[Row]:
    hidden, intermediate = SHAPES[shape]
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=generator)
    weights, ids = select_experts(torch.randn(tokens, NUM_EXPERTS, generator=generator), TOP_K)
    rows = []
    # tp2-ep: both ranks hold every token.
    comm = CountingCommunicator(dist.group.WORLD, RANKS)
    tp_layer = moe(hidden, intermediate, rank, ParallelState(tp=comm))
    with parallel_state(ParallelState(tp=comm)):
        tp_ms = timed(lambda: tp_layer(x, weights, ids), repeats)
    sent = comm.handed / repeats * 2 * (RANKS - 1) / RANKS * RANKS  # all ranks
    rows.append(Row(shape, "tp2-ep", tokens, sent / tokens, tp_ms))
    # dp2-ep: each rank holds its half of the tokens.
    group = ExpertGroup(new_group(store, f"bench/{shape}/{tokens}/", rank, RANKS, "gloo", 60),
                        rank, RANKS)
    state = ParallelState(ep=group)
    dp_layer = moe(hidden, intermediate, rank, state)
    half = slice(rank * tokens // RANKS, (rank + 1) * tokens // RANKS)
    dp_ms = timed(lambda: dp_layer(x[half], weights[half], ids[half]), repeats)
    total = torch.tensor([group.bytes_sent / repeats])
    dist.all_reduce(total)
    rows.append(Row(shape, "dp2-ep", tokens, float(total) / tokens, dp_ms))
    return rows


def worker(rank: int, port: int, args: argparse.Namespace, results) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, RANKS, rank == 0,
                          datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("world/", store), rank=rank,
                            world_size=RANKS)
    rows = [row for shape in args.shapes for tokens in args.tokens
            for row in measure(rank, shape, tokens, args.repeats, store)]
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=lambda s: [int(t) for t in s.split(",")],
                        default=[16, 256], help="tokens per step, all ranks together")
    parser.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [context.Process(target=worker, args=(rank, port, args, results))
             for rank in range(RANKS)]
    for proc in procs:
        proc.start()
    rows = results.get(timeout=1800)
    for proc in procs:
        proc.join()
    print(f"{'shape':6} {'scheme':7} {'tokens':>6} {'bytes/layer/token':>18} {'layer ms':>9}")
    for row in rows:
        print(f"{row.shape:6} {row.scheme:7} {row.tokens:6d} {row.bytes_per_token:18.0f} "
              f"{row.layer_ms:9.2f}")


if __name__ == "__main__":
    main()
