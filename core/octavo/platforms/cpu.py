"""The built-in CPU platform: portable PyTorch, available everywhere."""

from __future__ import annotations

import os

from octavo.platforms.base import Availability, Platform


def _meminfo_bytes(field: str) -> int:
    """A field of /proc/meminfo in bytes (Linux); 0 where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# Native bf16 dot products (AVX512-BF16, or AMX tiles): there bf16 weights halve the memory
# traffic of every decode step (see models/layers/cpu_gemm.py for the GEMMs). Elsewhere
# bf16 is emulated and slower than fp32, so fp32 stays the default.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_amx() -> bool:
    """AMX tiles: bf16 GEMMs outrun fp32 ones at every batch size."""
    return "amx_bf16" in cpu_flags()


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    priority = 0
    dist_backend = "gloo"
    default_dtype = "bfloat16" if cpu_flags() & BF16_FLAGS else "float32"
    attention_backend = "torch"

    @classmethod
    def check_available(cls) -> Availability:
        return Availability.yes(f"portable PyTorch on {os.cpu_count()} CPU cores")

    @classmethod
    def total_memory(cls) -> int:
        return _meminfo_bytes("MemTotal")

    @classmethod
    def free_memory(cls) -> int:
        return _meminfo_bytes("MemAvailable")
