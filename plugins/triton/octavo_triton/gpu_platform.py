"""What the CUDA and ROCm platforms share: torch's GPU device API (which ROCm builds of
torch expose under ``torch.cuda`` too), the Triton kernels of this distribution and the
GPU worker (profiling-based KV sizing, CUDA graphs). Each platform brings its own
:class:`~octavo_triton.tuning.KernelTuning`."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from octavo.platforms import Availability, Platform
from octavo_triton.tuning import DEFAULT_TUNING, KernelTuning

if TYPE_CHECKING:
    from octavo.worker.worker import Worker


class TritonGpuPlatform(Platform):
    device_type = "cuda"  # torch's device type for both NVIDIA and AMD GPUs
    default_dtype = "bfloat16"
    attention_backend = "triton"
    kernel_tuning: ClassVar[KernelTuning] = DEFAULT_TUNING

    @classmethod
    def worker_class(cls) -> type[Worker]:
        from octavo_triton.gpu_worker import GpuWorker

        return GpuWorker

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
