"""Which cores each worker process's threads run on (vLLM's ``VLLM_CPU_OMP_THREADS_BIND``).

With several workers on one CPU, each rank's OpenMP threads must keep to their own cores:
two ranks whose thread pools share cores slow each other down many times over (spinning
OpenMP threads of one rank take the cores the other's need). ``OCTAVO_CPU_OMP_THREADS_BIND``:

- unset or ``auto``: the cores this process may use, split evenly in order (rank 0 the
  first share); with more ranks than cores, rank ``r`` gets core ``r mod cores``;
- ``nobind``: no binding (the threads of every rank float over every core);
- one core list per rank separated by ``|``, e.g. ``0|1`` or ``0-3|4-7`` or ``0,2|1,3``.
"""

from __future__ import annotations

import os

THREADS_BIND_ENV = "OCTAVO_CPU_OMP_THREADS_BIND"


def parse_cpu_list(text: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``."""
    cores: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            lo, hi = int(first), int(last if dash else first)
        except ValueError:
            raise ValueError(f"{THREADS_BIND_ENV}: {text!r} is not a core list such as "
                             "'0-3,6'") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"{THREADS_BIND_ENV}: bad core range {part.strip()!r}")
        cores.extend(range(lo, hi + 1))
    return cores


def worker_cores(rank: int, world_size: int, spec: str | None,
                 available: list[int]) -> list[int] | None:
    """The cores of worker ``rank`` of ``world_size``; None: do not bind."""
    if spec is None or spec.strip() in ("", "auto"):
        if world_size > len(available):
            return [available[rank % len(available)]]
        share = len(available) // world_size
        return available[rank * share:(rank + 1) * share]
    if spec.strip() == "nobind":
        return None
    lists = spec.split("|")
    if len(lists) != world_size:
        raise ValueError(f"{THREADS_BIND_ENV}={spec!r} names {len(lists)} core lists for "
                         f"{world_size} workers; give one per worker, separated by '|'")
    return parse_cpu_list(lists[rank])


def bind_worker_threads(rank: int, world_size: int) -> list[int] | None:
    """Pin this process to its cores and size torch's thread pool to them; returns them."""
    import torch

    available = sorted(os.sched_getaffinity(0))
    cores = worker_cores(rank, world_size, os.environ.get(THREADS_BIND_ENV), available)
    if cores is not None:
        try:
            os.sched_setaffinity(0, cores)
        except OSError as exc:
            raise ValueError(f"{THREADS_BIND_ENV}: worker {rank} cannot run on cores {cores} "
                             f"({exc.strerror}); this process may use cores {available}") from None
        torch.set_num_threads(len(cores))
    return cores
