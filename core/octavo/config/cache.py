"""``CacheConfig``: the paged KV cache - block size, prefix caching, how much memory, and the
dtype its keys and values are stored in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints, parse_memory

if TYPE_CHECKING:
    import torch

# vLLM's --kv-cache-dtype values -> torch's dtype name (None: the model's dtype). fp8 is
# e4m3, as in vLLM; torch is imported only when one is resolved.
KV_CACHE_DTYPES: dict[str, str | None] = {
    "auto": None, "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2"}


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
    kv_cache_dtype: str = field(default="auto", metadata={
        "help": "KV-cache storage: auto, the model's dtype; fp8 (= fp8_e4m3) or fp8_e5m2, one "
                "byte per element (twice the blocks of bf16), scaled by the checkpoint's "
                "k_scale/v_scale where it has them, else 1.0.",
        "choices": tuple(KV_CACHE_DTYPES)})
    calculate_kv_scales: bool = field(default=False, metadata={
        "help": "fp8 KV cache: each layer's k_scale/v_scale from the first keys and values it "
                "stores (max |key| / 200, max |value| / 100, as vLLM) instead of the "
                "checkpoint's or 1.0."})
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
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; "
                              f"got {self.kv_cache_dtype!r}")
        if self.calculate_kv_scales and KV_CACHE_DTYPES[self.kv_cache_dtype] is None:
            raise ConfigError("calculate_kv_scales scales an fp8 KV cache: it needs "
                              "kv_cache_dtype fp8, fp8_e4m3 or fp8_e5m2, not "
                              f"{self.kv_cache_dtype!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("gpu_memory_utilization must be in (0, 1], got "
                              f"{self.gpu_memory_utilization}")

    def kv_torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype KV cache tensors are allocated in: ``model_dtype`` for auto."""
        name = KV_CACHE_DTYPES[self.kv_cache_dtype]
        if name is None:
            return model_dtype
        import torch

        dtype: torch.dtype = getattr(torch, name)
        return dtype
