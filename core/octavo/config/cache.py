"""``CacheConfig``: the paged KV cache - block size, prefix caching, how much memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints, parse_memory


@dataclass
class CacheConfig:
    block_size: int = field(default=16, metadata={"help": "Tokens per KV-cache block."})
    enable_prefix_caching: bool = field(default=True, metadata={
        "help": "Reuse KV blocks of shared prompt prefixes."})
    kv_cache_memory: int | None = field(default=None, metadata={
        "help": "KV-cache size, e.g. 2GiB (default on CPU: min(1GiB, 40% of free RAM)).",
        "parse": parse_memory})
    gpu_memory_utilization: float = field(default=0.9, metadata={
        "help": "Devices: fraction of memory for weights and KV cache."})
    # Set by the engine once the worker has sized the KV cache (vLLM's num_gpu_blocks).
    num_gpu_blocks: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        check_positive_ints("", block_size=self.block_size)
        if isinstance(self.kv_cache_memory, str):  # LLM(kv_cache_memory="2GiB"), as the CLI
            self.kv_cache_memory = parse_memory(self.kv_cache_memory)
        if self.kv_cache_memory is not None and (
                isinstance(self.kv_cache_memory, bool) or self.kv_cache_memory <= 0):
            raise ConfigError(f"kv_cache_memory must be a positive number of bytes, "
                              f"got {self.kv_cache_memory}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("gpu_memory_utilization must be in (0, 1], got "
                              f"{self.gpu_memory_utilization}")
