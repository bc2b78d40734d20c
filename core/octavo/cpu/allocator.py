"""Host memory for the CPU backend: freed blocks kept for reuse (glibc's ``mallopt``), as
vLLM's CPU backend gets from tcmalloc, and 2 MiB pages for the packed weights.

PyTorch's CPU allocator is plain ``malloc``. glibc serves every block above its mmap
threshold (128 KiB, rising to at most 32 MiB) with a fresh ``mmap`` and returns it to the
kernel on ``free``, so a prefill step's activations (tens of MB per layer output at
thousands of tokens) are page-faulted and zeroed by the kernel anew in every layer of every
step. Raising the threshold and turning off trimming keeps those pages in the heap, where
the next layer's tensors of the same sizes reuse them: W1's prefill took 12.5 s before and
11.0 s after on an AVX512-BF16 EPYC (benchmarks/RESULTS.md). The process keeps its
high-water mark instead of shrinking after a burst, as with tcmalloc or jemalloc.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import mmap

import torch

from octavo.host_memory import libc

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 30  # blocks up to 1 GiB come from the heap
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest, about 2 GiB


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc to keep freed blocks for reuse; once per process. False where the C
    library has no ``mallopt`` (musl, macOS) or refuses the settings: nothing changes."""
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    if not kept:
        logger.debug("mallopt refused the allocator settings; freed memory goes back at once")
    return kept


HUGE_PAGE_BYTES = 2 << 20
ARENA_SEGMENT_BYTES = 64 << 20
ARENA_ALIGN = 64  # a cache line: the kernels' 64-byte loads never straddle two


class HugePageArena:
    """Tensors that live as long as the model (the pair GEMM's packed weights), carved one
    after another out of anonymous mappings marked ``MADV_HUGEPAGE``, so that Linux backs
    them with 2 MiB pages where transparent huge pages are in ``madvise`` mode (the common
    default). A decode step streams every weight from memory, and on 4 KiB pages each
    GEMM's weights span hundreds of pages, a TLB miss and page walk every 4 KiB: 2 MiB pages
    took the pair GEMM from ~405 to ~425 GFLOP/s at 64 rows on an AVX512-BF16 EPYC
    (SmolLM2-135M's layer shapes, weights from memory).

    A segment stays mapped while any tensor in it lives (each tensor holds its mapping);
    nothing is reused within one, so it suits what is allocated once. Where the kernel
    refuses the advice, or has no huge pages, the tensors sit on ordinary pages."""

    def __init__(self, segment_bytes: int = ARENA_SEGMENT_BYTES) -> None:
        self.segment_bytes = segment_bytes
        self._segment: mmap.mmap | None = None
        self._used = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new tensor of ``shape`` in the arena, for the caller to fill."""
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        start = -(-self._used // ARENA_ALIGN) * ARENA_ALIGN
        if self._segment is None or start + nbytes > len(self._segment):
            self._segment = _huge_page_mapping(max(nbytes, self.segment_bytes))
            start = 0
        self._used = start + nbytes
        return torch.frombuffer(self._segment, dtype=dtype, count=count,
                                offset=start).view(shape)


def _huge_page_mapping(nbytes: int) -> mmap.mmap:
    """``nbytes`` of private anonymous memory (rounded up to whole 2 MiB pages) that asks the
    kernel for huge pages. Every mapping starts page-aligned; Linux backs with huge pages
    the 2 MiB-aligned stretches that lie wholly inside it."""
    nbytes = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    segment = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if advice is not None:
        try:
            segment.madvise(advice)
        except OSError as exc:  # a kernel built without transparent huge pages
            logger.debug("no huge pages for the packed weights: %s", exc)
    return segment


@functools.cache
def weight_arena() -> HugePageArena:
    """The process's arena for packed weights."""
    return HugePageArena()
