"""What the CUDA and ROCm platforms share: torch's GPU device API (which ROCm builds of
torch expose under ``torch.cuda`` too) and the Triton kernels of this distribution."""

from __future__ import annotations

from octavo.platforms import Availability, Platform


class TritonGpuPlatform(Platform):
    device_type = "cuda"  # torch's device type for both NVIDIA and AMD GPUs
    default_dtype = "bfloat16"
    missing_kernels = (
        "the Triton attention backend and GPU model runner are not implemented yet in this "
        "release; use --backend cpu"
    )

    @classmethod
    def _device_probe(cls) -> Availability:
        """Whether torch sees at least one GPU; never raises."""
        try:
            import torch
        except ImportError as exc:
            return Availability.no(f"torch cannot be imported: {exc}")
        try:
            count = torch.cuda.device_count()
        except Exception as exc:  # a broken driver install raises here
            return Availability.no(f"torch.cuda.device_count() failed: {exc}")
        if count == 0:
            return Availability.no("torch sees no GPU device (torch.cuda.device_count() == 0)")
        names = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(count)}))
        return Availability.yes(f"{count} x {names}")

    @classmethod
    def total_memory(cls) -> int:
        import torch

        return torch.cuda.mem_get_info()[1]

    @classmethod
    def free_memory(cls) -> int:
        import torch

        return torch.cuda.mem_get_info()[0]
