"""The CUDA platform: an NVIDIA GPU seen by a CUDA (not HIP) build of torch."""

from __future__ import annotations

from octavo.plugin_api import Availability
from octavo_triton.gpu_platform import TritonGpuPlatform
from octavo_triton.tuning import KernelTuning


class CudaPlatform(TritonGpuPlatform):
    name = "cuda"
    priority = 100
    dist_backend = "nccl"
    attention_backend = "triton"
    distribution = "octavo-cuda"
    # 32-lane warps: 4 warps per attention program, two pipeline stages hide the loads of
    # the next cache block (Ampere and Hopper alike). Split-KV below ~one program per SM.
    kernel_tuning = KernelTuning(name="cuda", attention_warps=4, attention_stages=2,
                                 prefill_block_m=64, decode_block_m=16,
                                 split_kv_max_programs=128)

    @classmethod
    def check_available(cls) -> Availability:
        try:
            import torch
        except ImportError as exc:
            return Availability.no(f"torch cannot be imported: {exc}")
        if torch.version.hip is not None:
            return Availability.no(
                f"torch {torch.__version__} is a HIP (ROCm) build; use --backend rocm")
        if torch.version.cuda is None:
            return Availability.no(
                f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
                "install a CUDA build of torch")
        return cls._device_probe()
