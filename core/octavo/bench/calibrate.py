"""The machine's peaks, measured in a second or two: a large GEMM for FLOP/s (in the
model's dtype and of the model's own widest shape, so the figure is one its steps can
reach) and a large read for bandwidth (a sum over a tensor many times the last-level
cache, which does almost no arithmetic per byte). Best of a few repeats, on torch's threads
as the engine has them."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from octavo.bench.roofline import ModelShape, Peaks

GEMM_ROWS = 4096  # tokens: enough rows for the GEMM to run at its best
READ_BYTES = 1 << 30  # far beyond any last-level cache
REPEATS = 5


def measure_peaks(shape: ModelShape, dtype: torch.dtype = torch.bfloat16,
                  read_bytes: int = READ_BYTES, repeats: int = REPEATS) -> Peaks:
    return Peaks(flops_per_s=gemm_flops_per_s(shape, dtype, repeats),
                 bytes_per_s=read_bytes_per_s(read_bytes, repeats))


def gemm_flops_per_s(shape: ModelShape, dtype: torch.dtype, repeats: int) -> float:
    """``F.linear`` of (GEMM_ROWS x hidden) by the MLP's (intermediate x hidden) weight."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(GEMM_ROWS, shape.hidden_size, generator=generator).to(dtype)
    weight = torch.randn(shape.intermediate_size, shape.hidden_size,
                         generator=generator).to(dtype)
    F.linear(inputs, weight)  # warm: first-call setup, the weight in cache
    flops = 2 * GEMM_ROWS * shape.hidden_size * shape.intermediate_size
    return flops / _best_time(lambda: F.linear(inputs, weight), repeats)


def read_bytes_per_s(num_bytes: int, repeats: int) -> float:
    data = torch.rand(num_bytes // 4, generator=torch.Generator().manual_seed(1))
    data.sum()  # warm: pages touched
    return data.numel() * 4 / _best_time(data.sum, repeats)


def _best_time(run: object, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best
