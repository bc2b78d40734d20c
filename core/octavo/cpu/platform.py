"""The built-in CPU platform: portable PyTorch, available everywhere, with the fused C kernels
(``octavo.cpu.kernels``) and prepacked GEMMs (``octavo.cpu.gemm``) for bf16 models."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from octavo.config.cache import KV_CACHE_DTYPES
from octavo.host_memory import meminfo_bytes, return_freed_memory
from octavo.platforms.base import Availability, Platform

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed import ProcessGroup

    from octavo.config.compilation import CompilationConfig
    from octavo.distributed.state import TensorCommunicator
    from octavo.lora.ops import BindDelta


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
# traffic of every decode step (see octavo/cpu/gemm.py for the GEMMs). Elsewhere
# bf16 is emulated and slower than fp32, so fp32 stays the default.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 is the CPU default, and oneDNN's bf16 GEMM the fast one."""
    return bool(cpu_flags() & BF16_FLAGS)


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    priority = 0
    dist_backend = "gloo"
    default_dtype = "bfloat16" if cpu_has_native_bf16() else "float32"
    attention_backend = "cpu"
    kv_cache_dtypes = tuple(KV_CACHE_DTYPES)  # fp8 on the portable attention path

    @classmethod
    def check_available(cls) -> Availability:
        return Availability.yes(f"portable PyTorch on {os.cpu_count()} CPU cores")

    @classmethod
    def has_amx(cls) -> bool:
        """AMX tiles: oneDNN's bf16 GEMM takes large row counts there (octavo.cpu.gemm)."""
        return "amx_bf16" in cpu_flags()

    @classmethod
    def total_memory(cls) -> int:
        return meminfo_bytes("MemTotal")

    @classmethod
    def free_memory(cls) -> int:
        return meminfo_bytes("MemAvailable")

    @classmethod
    def init_worker_process(cls, rank: int, world_size: int) -> None:
        """Each rank's threads on cores of its own (``octavo.cpu.threads``)."""
        from octavo.cpu.threads import bind_worker_threads

        bind_worker_threads(rank, world_size)

    @classmethod
    def tensor_communicator(cls, group: ProcessGroup, rank_in_group: int,
                            fallback: TensorCommunicator) -> TensorCommunicator:
        """All-reduce through shared memory between the local ranks, gloo for tensors too
        large for its slots: many times faster than gloo over loopback TCP for the
        activations of a decode step (benchmarks/allreduce.py)."""
        from torch import distributed as dist

        from octavo.cpu.shm_allreduce import ShmCommunicator

        return ShmCommunicator(group, rank_in_group, dist.get_world_size(group),
                               fallback=fallback)

    @classmethod
    def lora_kernels(cls) -> tuple[Callable[..., None], Callable[..., None]] | None:
        """The C shrink/expand (``octavo.cpu.lora``) where the kernels' library is built."""
        from octavo.cpu import lora

        return (lora.lora_shrink, lora.lora_expand) if lora.available() else None

    @classmethod
    def lora_delta(cls) -> BindDelta | None:
        """The C layer delta (``octavo.cpu.lora.bind_delta``) where the library is built: a
        decode step of W1 made ~420 shrink/expand calls of ~100 us fixed cost each."""
        from octavo.cpu import lora

        return lora.bind_delta if lora.available() else None

    @classmethod
    def prepare_model(cls, model: nn.Module, dtype: torch.dtype) -> int:
        """For a bf16 model: prepack the loaded weights for the CPU's GEMMs (fp8 layers' too:
        ``octavo.cpu.fp8_gemm``), fuse the element-wise layers and run decode steps a layer
        per call; nothing otherwise (fp32 runs PyTorch's own kernels). In any dtype, layers
        kept in GGUF blocks multiply with the quantized kernels (``octavo.cpu.quant``), and
        the process's allocator keeps freed memory for the next step
        (``octavo.cpu.allocator``). Imported here: a process that lists platforms does not
        load torch or build the kernels."""
        import torch

        from octavo.cpu.allocator import keep_freed_memory
        from octavo.cpu.decode_layer import use_fused_decode_layers
        from octavo.cpu.fp8_gemm import attach_fp8_gemms
        from octavo.cpu.gemm import attach_cpu_gemms, cpu_gemm_supported
        from octavo.cpu.layers import use_cpu_layers
        from octavo.cpu.quant import attach_quant_gemms

        keep_freed_memory()
        quantized = attach_quant_gemms(model)
        if not cpu_gemm_supported(dtype, torch.device("cpu")):
            return quantized
        changed = (quantized
                   + attach_cpu_gemms(model, native_bf16=cpu_has_native_bf16(), amx=cls.has_amx())
                   + attach_fp8_gemms(model) + use_cpu_layers(model)
                   + use_fused_decode_layers(model))
        return_freed_memory()  # the plain weights the packed copies replaced
        return changed

    @classmethod
    def compile_model(cls, model: nn.Module, compilation: CompilationConfig) -> None:
        """``-O``: the plain PyTorch model through ``torch.compile`` (``octavo.cpu.compile``)
        *instead of* the fused bf16 kernels and prepacked GEMMs: Dynamo cannot see into
        those (they run a whole decoder layer in C), so compiling around them would compile
        almost nothing; with ``-O`` the model runs as a new architecture without fused
        kernels would, which is what ``-O`` is for and what it is measured against. Layers
        kept in GGUF blocks (``--quantization gguf``) still multiply with the quantized
        kernels (they hold no plain weights), each a graph break."""
        from octavo.cpu.allocator import keep_freed_memory
        from octavo.cpu.compile import compile_forward
        from octavo.cpu.quant import attach_quant_gemms

        keep_freed_memory()
        attach_quant_gemms(model)
        compile_forward(model, compilation)
