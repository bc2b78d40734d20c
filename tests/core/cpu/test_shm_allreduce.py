"""``ShmCommunicator`` between real processes: gloo on 127.0.0.1 for setup and the fallback,
a real shared segment for the collectives, fresh random inputs checked against a dense sum
computed here from the same seeds."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from octavo.cpu.shm_allreduce import ShmCommunicator
from octavo.distributed.state import ProcessGroupCommunicator
from octavo.net import free_port
from octavo.testing.seeds import draw_seed

MAX_BYTES = 256 << 10
JOIN_TIMEOUT_S = 180
SHAPES = [(1, 576), (16, 576), (64, 576), (3, 7)]
DTYPES = [torch.float32, torch.bfloat16]
RANDOM_CALLS = 500
LATE_S = 0.3  # the late peer of the deadline test arrives after this
DEADLINE_S = 1.0  # ... and the absent one is given up on after this


@dataclass(frozen=True)
class Call:
    """One collective of a plan every rank runs (``dim`` is None for an all_reduce)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    dim: int | None = None

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize


def plan(seed: int) -> list[Call]:
    """The listed shapes and dtypes, the all_gathers, the max_bytes boundary (the largest
    shared-memory call, then two fallbacks), then many random calls reusing the slots."""
    calls = [Call(shape, dtype) for dtype in DTYPES for shape in SHAPES]
    calls += [Call(shape, dtype, dim) for dtype in DTYPES for shape in [(3, 7), (16, 576)]
              for dim in (-1, 0)]
    calls += [Call((64, 1024), torch.float32), Call((128, 576), torch.float32),
              Call((128, 576), torch.float32, 0)]
    rng = random.Random(seed)
    calls += [Call((rng.randint(1, 16), rng.randint(1, 600)), rng.choice(DTYPES),
                   rng.choice([None, None, None, 0, -1])) for _ in range(RANDOM_CALLS)]
    return calls


def rank_input(seed: int, index: int, rank: int, call: Call) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index * 16 + rank)
    return torch.randn(call.shape, generator=generator).to(call.dtype)


def rank_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """The documented reduction: rank 0 + rank 1 + ..., in fp32 for 16-bit floats."""
    acc = parts[0].float()
    for part in parts[1:]:
        acc += part
    return acc.to(parts[0].dtype)


class CountingFallback(ProcessGroupCommunicator):
    """The gloo communicator, counting the calls that reach it."""

    calls = 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().all_reduce(tensor)

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        self.calls += 1
        return super().all_gather(tensor, dim)


def run_plan(comm: ShmCommunicator, fallback: CountingFallback, rank: int, world: int,
             seed: int) -> dict:
    outputs = []
    for index, call in enumerate(plan(seed)):
        tensor = rank_input(seed, index, rank, call)
        outputs.append(comm.all_reduce(tensor) if call.dim is None
                       else comm.all_gather(tensor, call.dim))
    return {"outputs": outputs, "fallback_calls": fallback.calls}


def run_late_then_absent(comm: ShmCommunicator, fallback: CountingFallback, rank: int,
                         world: int, seed: int) -> dict:
    """The last rank is late for the first call, then never comes to the second."""
    call = Call((16, 576), torch.float32)
    if rank == world - 1:
        time.sleep(LATE_S)
    first = comm.all_reduce(rank_input(seed, 0, rank, call))
    if rank == world - 1:
        return {"first": first}
    start = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        comm.all_reduce(rank_input(seed, 1, rank, call))
    return {"first": first, "error": str(raised.value), "waited_s": time.monotonic() - start}


SCENARIOS: dict[str, Callable[..., dict]] = {
    "plan": run_plan, "late_then_absent": run_late_then_absent}


def rank_main(rank: int, world: int, port: int, scenario: str, seed: int,
              out_dir: str) -> None:
    """One rank's process: join the group, run ``scenario``, save what it returns."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        group = dist.group.WORLD
        fallback = CountingFallback(group, world)
        comm = ShmCommunicator(group, rank, world, max_bytes=MAX_BYTES, fallback=fallback,
                               timeout_s=DEADLINE_S if scenario == "late_then_absent" else 60)
        try:
            result = SCENARIOS[scenario](comm, fallback, rank, world, seed)
        finally:
            comm.close()
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, scenario: str, seed: int, out_dir: Path) -> list[dict]:
    """Spawn ``world`` ranks, wait (bounded) for all to exit cleanly, kill any left over."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(rank, world, port, scenario, seed,
                                                 str(out_dir)), daemon=True)
             for rank in range(world)]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        codes = [proc.exitcode for proc in procs]
        assert codes == [0] * world, f"rank exit codes {codes} (None: still running)"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(world)]


def expected(seed: int, index: int, call: Call, world: int) -> torch.Tensor:
    parts = [rank_input(seed, index, rank, call) for rank in range(world)]
    return rank_order_sum(parts) if call.dim is None else torch.cat(parts, dim=call.dim)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_match_the_dense_reference(world: int, tmp_path: Path) -> None:
    seed = draw_seed()
    results = run_ranks(world, "plan", seed, tmp_path)
    calls = plan(seed)
    for index, call in enumerate(calls):
        outputs = [result["outputs"][index] for result in results]
        where = f"call {index} {call} (seed {seed})"
        for output in outputs[1:]:
            assert torch.equal(output, outputs[0]), f"ranks differ at {where}"
        want = expected(seed, index, call, world)
        if call.nbytes <= MAX_BYTES or call.dim is not None:
            assert torch.equal(outputs[0], want), where
        else:  # gloo's own summation order
            torch.testing.assert_close(outputs[0], want, msg=where)
    fallbacks = sum(call.nbytes > MAX_BYTES for call in calls)
    assert fallbacks == 2
    assert [result["fallback_calls"] for result in results] == [fallbacks] * world


def test_a_late_peer_is_waited_for_and_an_absent_one_raises(tmp_path: Path) -> None:
    world = 3
    seed = draw_seed()
    results = run_ranks(world, "late_then_absent", seed, tmp_path)
    want = expected(seed, 0, Call((16, 576), torch.float32), world)
    assert all(torch.equal(result["first"], want) for result in results)
    for result in results[:-1]:
        assert f"ranks [{world - 1}] of the group did not arrive" in result["error"]
        assert DEADLINE_S <= result["waited_s"] < DEADLINE_S + 5
