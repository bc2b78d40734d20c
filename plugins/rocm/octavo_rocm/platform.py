"""The ROCm platform: an AMD GPU seen by a HIP build of torch (``torch.version.hip``)."""

from __future__ import annotations

from octavo.plugin_api import Availability
from octavo_triton.gpu_platform import TritonGpuPlatform
from octavo_triton.tuning import KernelTuning


class RocmPlatform(TritonGpuPlatform):
    name = "rocm"
    priority = 90
    dist_backend = "nccl"  # RCCL, reached through torch's "nccl" backend on HIP builds
    attention_backend = "triton"
    distribution = "octavo-rocm"
    wavefront_size = 64  # AMD CDNA wavefronts are 64 lanes wide; kernels tune block sizes to it
    # 4 wavefronts of 64 lanes = 256 threads per program, like 8 NVIDIA warps: the same tile
    # sizes keep every lane busy with half the wavefronts. AMD's Triton pipeliner does best
    # with one stage here; 16x16 MFMA instructions suit the 16-row decode tiles, and two
    # waves per SIMD (waves_per_eu) trade occupancy for registers. MI200/MI300 have
    # 104-304 compute units, hence more programs before splitting the KV.
    kernel_tuning = KernelTuning(name="rocm", attention_warps=4, attention_stages=1,
                                 prefill_block_m=64, decode_block_m=16,
                                 split_kv_max_programs=256, elementwise_warps=4,
                                 extra_options={"waves_per_eu": 2, "matrix_instr_nonkdim": 16})

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
