"""How a bf16 linear layer multiplies on the CPU.

``F.linear`` on bf16 tensors re-reads the weight in its plain ``[out, in]`` layout every
call. Three faster paths, chosen per call by the number of rows ``T``:

- one row (a single request's decode step): the fused CPU kernels' GEMV on the plain
  weight (``octavo.kernels.cpu.gemv``), when they are built here.
- few rows (decode): oneDNN with the weight reordered once into its blocked layout
  (``mkldnn._reorder_linear_weight``). Decoding is bound by reading the weights, and the
  blocked layout streams them ~1.4x faster than ``F.linear`` (SmolLM2-135M, T=1).
- many rows (prefill, large decode batches), on CPUs whose bf16 arrives by AVX512-BF16
  alone: an fp32 GEMM on an fp32 copy of the weight, also prepacked for oneDNN (1.1-1.4x
  the speed of ``F.linear``'s MKL path on the same fp32 weight at T=32..256).
  ``vdpbf16ps`` does no more multiply-adds per cycle than fp32 FMAs, so oneDNN's bf16
  kernels run at ~0.6x of its fp32 ones there (measured at T=64..512); with AMX tiles
  bf16 is the faster, and the bf16 path serves every call. The result is the same
  computation a bf16 GEMM does - bf16 products accumulated in fp32, rounded to bf16 at
  the end - in another order.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.kernels import cpu as cpu_kernels

# Rows from which the fp32 copy beats the blocked bf16 weight (measured crossover ~32 for
# SmolLM2-135M's layers, weights streamed from memory as in a decode step).
LARGE_ROWS = 32


class CpuGemm:
    """``x @ weight.T + bias`` for one bf16 layer, on prepacked copies of its weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fp32_for_large: bool,
                 ) -> None:
        self.bias = bias
        self.weight = weight  # the layer's own tensor, not a copy
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.packed32 = (torch.ops.mkldnn._reorder_linear_weight(weight.float(), None)
                         if fp32_for_large else None)
        self.bias32 = None if bias is None or not fp32_for_large else bias.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1] and x.is_contiguous() and cpu_kernels.usable(x):
            return cpu_kernels.gemv(x, self.weight, self.bias).view(*x.shape[:-1], -1)
        if self.packed32 is not None and x.numel() >= LARGE_ROWS * x.shape[-1]:
            return _linear(x.float(), self.packed32, self.bias32).to(x.dtype)
        return _linear(x, self.packed, self.bias)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear on a weight from ``_reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def cpu_gemm_supported(dtype: torch.dtype, device: torch.device) -> bool:
    return (dtype == torch.bfloat16 and device.type == "cpu"
            and torch.backends.mkldnn.is_available())


def attach_cpu_gemms(model: nn.Module, fp32_for_large: bool) -> int:
    """Give every bf16 layer with a ``cpu_gemm`` slot its :class:`CpuGemm`, from the loaded
    weights (call it after loading; later weight changes are not seen). Returns how many."""
    attached = 0
    for module in model.modules():
        if not hasattr(module, "cpu_gemm"):
            continue
        weight = module.weight
        if not cpu_gemm_supported(weight.dtype, weight.device):
            continue
        bias = getattr(module, "bias", None)
        module.cpu_gemm = CpuGemm(weight.detach(), None if bias is None else bias.detach(),
                                  fp32_for_large)
        attached += 1
    return attached
