"""Keeping freed host memory for reuse (glibc's ``mallopt``), as vLLM's CPU backend gets from
tcmalloc.

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
import ctypes.util
import functools
import logging

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 30  # blocks up to 1 GiB come from the heap
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest, about 2 GiB


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def return_freed_memory() -> None:
    """Give the kernel back every whole page the heap holds free (glibc's ``malloc_trim``):
    after a model's load and prepacking, the plain weights it released lie in holes between
    the packed copies, too small for the activations to reuse, and would otherwise stay
    resident for the process's life (212 MB for SmolLM2-135M)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim(0)


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc to keep freed blocks for reuse; once per process. False where the C
    library has no ``mallopt`` (musl, macOS) or refuses the settings: nothing changes."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    if not kept:
        logger.debug("mallopt refused the allocator settings; freed memory goes back at once")
    return kept
