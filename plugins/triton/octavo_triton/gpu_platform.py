"""What the CUDA and ROCm platforms share: torch's GPU device API (which ROCm builds of
torch expose under ``torch.cuda`` too), the Triton kernels of this distribution and the
GPU worker (profiling-based KV sizing, CUDA graphs). Each platform brings its own
:class:`~octavo_triton.tuning.KernelTuning`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from octavo.plugin_api import Availability, Platform
from octavo_triton.tuning import DEFAULT_TUNING, KernelTuning

if TYPE_CHECKING:
    import torch
    from torch import nn

logger = logging.getLogger(__name__)


class TritonGpuPlatform(Platform):
    device_type = "cuda"  # torch's device type for both NVIDIA and AMD GPUs
    default_dtype = "bfloat16"
    attention_backend = "triton"
    kernel_tuning: ClassVar[KernelTuning] = DEFAULT_TUNING
    worker_cls = "octavo_triton.gpu_worker.GpuWorker"

    @classmethod
    def prepare_model(cls, model: nn.Module, dtype: torch.dtype) -> int:
        """Switch the model's norm, rotary and activation layers onto the Triton kernels."""
        from octavo_triton.layers import use_triton_layers

        switched = use_triton_layers(model)
        logger.info("%s: %d layers on Triton kernels, tuning %r", cls.name, switched,
                    cls.kernel_tuning.name)
        return switched

    @classmethod
    def init_worker_process(cls, rank: int, world_size: int) -> None:
        """One GPU per rank (``rank mod`` the GPUs torch sees), chosen before anything
        allocates on the device; NCCL and the CUDA graphs of this rank then use it."""
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())

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
