"""The all-to-all dispatch of expert parallelism across engines, on 3 real gloo ranks (6
experts, top-2, 2 per rank): each rank's tokens (5, none, 9: uneven counts and an idle
engine) through ``FusedMoE`` with the expert group equal one rank holding every expert
(fp32, within rounding of the different summation order), a dummy pass after it keeps the
group in step, and ``ExpertGroup.bytes_sent`` is exactly the rows each rank sent others.
Then the last rank exits: the others' next collective raises ``ExpertGroupBroken`` (gloo's
connection to it closed, not its timeout), which ends a worker rather than one step."""

from __future__ import annotations

import os
import time
import traceback

import torch
import torch.multiprocessing as mp

from octavo.distributed.engine_group import (
    ExpertGroup,
    ExpertGroupBroken,
    engine_store,
    new_group,
)
from octavo.distributed.state import ParallelState, parallel_state
from octavo.models.layers.moe import FusedMoE, select_experts
from octavo.net import free_port

EXPERTS, HIDDEN, INTERMEDIATE, TOP_K = 6, 16, 24, 2
TOKENS = (5, 0, 9)  # per rank
RANKS = len(TOKENS)


def inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(TOKENS[rank], HIDDEN, generator=generator)
    weights, ids = select_experts(torch.randn(TOKENS[rank], EXPERTS, generator=generator),
                                  TOP_K)
    return x, weights, ids


def expected_bytes(rank: int) -> int:
    """Rows (and int64 ids) ``rank`` sends other ranks: its remote pairs out, and back the
    results of the pairs other ranks routed to it."""
    per_rank = EXPERTS // RANKS
    row = HIDDEN * 4
    out = int((inputs(rank)[2] // per_rank != rank).sum())
    back = sum(int((inputs(other)[2] // per_rank == rank).sum())
               for other in range(RANKS) if other != rank)
    return out * (row + 8) + back * row


def rank_main(rank: int, port: int, results) -> None:  # type: ignore[no-untyped-def]
    """One rank's check; its error's text instead when it raises (the test fails at once)."""
    try:
        check_rank(rank, port, results)
    except Exception:
        results.put((rank, traceback.format_exc(), 0, 0, 0))


def check_rank(rank: int, port: int, results) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    whole = FusedMoE(EXPERTS, HIDDEN, INTERMEDIATE, tp_rank=0, tp_size=1,
                     enable_expert_parallel=False)
    for param in whole.parameters():
        param.data.normal_(0, 0.2)
    store = engine_store("127.0.0.1", port, serve=rank == 0, timeout_s=60)
    group = ExpertGroup(new_group(store, "experts/", rank, RANKS, "gloo", 60), rank, RANKS)
    with parallel_state(ParallelState(ep=group)):
        layer = FusedMoE(EXPERTS, HIDDEN, INTERMEDIATE, tp_rank=0, tp_size=1,
                         enable_expert_parallel=True)
    local = slice(layer.local_experts.start, layer.local_experts.stop)
    layer.w13_weight.data.copy_(whole.w13_weight.data[local])
    layer.w2_weight.data.copy_(whole.w2_weight.data[local])
    x, weights, ids = inputs(rank)
    diff = (layer(x, weights, ids) - whole(x, weights, ids)).abs().flatten()
    gap = float(torch.cat([diff, torch.zeros(1)]).max())
    sent = group.bytes_sent
    layer.run_dummy()  # every rank together, no tokens
    results.put((rank, gap, sent, expected_bytes(rank), group.bytes_sent - sent))
    if rank == RANKS - 1:
        results.close()
        results.join_thread()  # its result sent first
        os._exit(0)  # then gone without a word, as a killed worker
    start = time.monotonic()
    try:
        group.exchange_counts(torch.zeros(RANKS, dtype=torch.int64))
        broken = "no error"
    except ExpertGroupBroken as exc:
        broken = f"ExpertGroupBroken: {exc}"
    results.put((rank, broken, time.monotonic() - start))


def test_dispatch_and_combine_equal_one_rank_and_count_bytes() -> None:
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [context.Process(target=rank_main, args=(rank, port, results))
             for rank in range(RANKS)]
    for proc in procs:
        proc.start()
    found = sorted(results.get(timeout=120) for _ in procs)
    after_exit = sorted(results.get(timeout=120) for _ in procs[:-1])
    for proc in procs:
        proc.join(30)
    print(f"\n(rank, max |gap|, bytes sent, expected, dummy pass bytes): {found}")
    print(f"after rank {RANKS - 1} exited (rank, error, seconds): {after_exit}")
    assert [rank for rank, *_ in found] == list(range(RANKS))
    for _rank, gap, sent, expected, dummy in found:
        assert not isinstance(gap, str), gap
        assert gap < 1e-5
        assert sent == expected and dummy == 0
    for _rank, broken, _seconds in after_exit:
        assert broken.startswith("ExpertGroupBroken") and "the expert group is broken" in broken
        assert "Timed out" not in broken, "found by gloo's timeout, not the closed connection"
