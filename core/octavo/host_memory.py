"""The host's memory as every process sees it, whatever the accelerator: how much there is
(/proc/meminfo) and giving freed heap pages back (glibc's ``malloc_trim``).

Why here, at the bottom: the API server bounds request bodies by the host's memory and
trims its heaps after large ones, and the CPU backend sizes its KV cache and trims after
prepacking weights; neither should reach into the other to do it.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def meminfo_bytes(field: str) -> int:
    """A field of /proc/meminfo in bytes (Linux), e.g. ``MemTotal``; 0 where it cannot be
    read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def libc() -> ctypes.CDLL | None:
    """The C library, or None where it cannot be found."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def return_freed_memory() -> None:
    """Give the kernel back every whole page the heaps hold free (glibc's ``malloc_trim``;
    nothing where the C library has none): freed blocks otherwise stay resident for the
    process's life."""
    trim = getattr(libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim(0)
