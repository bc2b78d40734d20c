"""Tensor-parallel all-reduce latency between CPU processes of one machine: gloo (loopback
TCP) against ``ShmCommunicator`` (shared memory), for the activations a decoder layer
reduces, ``[batch, hidden]``. One process per rank, each pinned to its own core where there
are enough; the table shows the median and p90 microseconds of one call on every rank.

    .venv/bin/python benchmarks/allreduce.py                       # 2 ranks, fp32, 1/16/64 rows
    .venv/bin/python benchmarks/allreduce.py --world-size 4 --dtype bfloat16 --iters 5000 \
        --batch-sizes 1,16,64,512 --output-json allreduce.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from octavo.cpu.shm_allreduce import ShmCommunicator
from octavo.distributed.state import ProcessGroupCommunicator, TensorCommunicator
from octavo.net import free_port

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
JOIN_TIMEOUT_S = 1800


@dataclass
class Timing:
    backend: str  # "gloo" or "shm"
    batch_size: int
    rank: int
    median_us: float
    p90_us: float


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=1000, help="timed calls per size")
    parser.add_argument("--warmup", type=int, default=100, help="untimed calls per size")
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--batch-sizes", default="1,16,64", help="rows, comma-separated")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--output-json", type=Path, default=None)
    return parser.parse_args()


def pin(rank: int, cores: list[int]) -> int | None:
    """Pin this process to a core of its own when there is one per rank."""
    if rank >= len(cores):
        return None
    os.sched_setaffinity(0, {cores[rank]})
    return cores[rank]


def time_calls(comm: TensorCommunicator, source: torch.Tensor, warmup: int,
               iters: int) -> list[float]:
    """Microseconds of each of ``iters`` all-reduces, after ``warmup`` untimed ones (the
    input is refreshed from ``source`` outside the timed span, so values never grow)."""
    tensor = source.clone()
    times = []
    for i in range(warmup + iters):
        tensor.copy_(source)
        start = time.perf_counter_ns()
        comm.all_reduce(tensor)
        if i >= warmup:
            times.append((time.perf_counter_ns() - start) / 1e3)
    return times


def rank_main(rank: int, args: argparse.Namespace, port: int, cores: list[int],
              results: multiprocessing.Queue) -> None:
    """One rank: pin, join gloo, time both communicators on every size, report."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    pin(rank, cores)
    world = args.world_size
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        gloo = ProcessGroupCommunicator(dist.group.WORLD, world)
        shm = ShmCommunicator(dist.group.WORLD, rank, world, fallback=gloo)
        comms = {"gloo": gloo, "shm": shm}
        generator = torch.Generator().manual_seed(rank)
        timings = []
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            source = torch.randn(batch, args.hidden, generator=generator).to(DTYPES[args.dtype])
            for name, comm in comms.items():
                dist.barrier()
                times = time_calls(comm, source, args.warmup, args.iters)
                timings.append(Timing(name, batch, rank, statistics.median(times),
                                      statistics.quantiles(times, n=10)[-1]))
        shm.close()
        results.put(timings)
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace) -> list[Timing]:
    """Spawn the ranks, collect their timings, and never leave one running."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    cores = sorted(os.sched_getaffinity(0))
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(rank, args, port, cores, results),
                         daemon=True) for rank in range(args.world_size)]
    try:
        for proc in procs:
            proc.start()
        timings = [t for _ in procs for t in results.get(timeout=JOIN_TIMEOUT_S)]
        for proc in procs:
            proc.join(60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    return sorted(timings, key=lambda t: (t.batch_size, t.backend, t.rank))


def print_table(timings: list[Timing], args: argparse.Namespace) -> None:
    itemsize = DTYPES[args.dtype].itemsize
    print(f"{args.world_size} ranks, {args.dtype}, hidden {args.hidden}, {args.iters} calls")
    print(f"{'batch':>6} {'KiB':>7} {'backend':>7} {'rank':>4} {'median µs':>10} {'p90 µs':>9}")
    for t in timings:
        kib = t.batch_size * args.hidden * itemsize / 1024
        print(f"{t.batch_size:>6} {kib:>7.1f} {t.backend:>7} {t.rank:>4} "
              f"{t.median_us:>10.1f} {t.p90_us:>9.1f}")


def main() -> None:
    args = parse_args()
    timings = run(args)
    print_table(timings, args)
    if args.output_json:
        args.output_json.write_text(json.dumps(
            {"world_size": args.world_size, "dtype": args.dtype, "hidden": args.hidden,
             "iters": args.iters, "warmup": args.warmup, "cores": len(os.sched_getaffinity(0)),
             "timings": [asdict(t) for t in timings]}, indent=2))


if __name__ == "__main__":
    main()
