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


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    priority = 0
    dist_backend = "gloo"
    default_dtype = "float32"
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
