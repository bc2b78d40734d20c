"""The ROCm platform: an AMD GPU seen by a HIP build of torch (``torch.version.hip``)."""

from __future__ import annotations

from octavo.platforms import Availability
from octavo_triton.gpu_platform import TritonGpuPlatform


class RocmPlatform(TritonGpuPlatform):
    name = "rocm"
    priority = 90
    dist_backend = "nccl"  # RCCL, reached through torch's "nccl" backend on HIP builds
    attention_backend = "triton"
    distribution = "octavo-rocm"
    wavefront_size = 64  # AMD CDNA wavefronts are 64 lanes wide; kernels tune block sizes to it

    @classmethod
    def check_available(cls) -> Availability:
        try:
            import torch
        except ImportError as exc:
            return Availability.no(f"torch cannot be imported: {exc}")
        if torch.version.hip is None:
            return Availability.no(
                f"torch {torch.__version__} is not a HIP build (torch.version.hip is None); "
                "install a ROCm build of torch")
        return cls._device_probe()
