"""How a bf16 linear layer multiplies on the CPU.

``F.linear`` on bf16 tensors re-reads the weight in its plain ``[out, in]`` layout every
call. Faster paths, chosen per call by the number of rows ``T``:

- one row (a single request's decode step): the fused CPU kernels' GEMV on the plain
  weight (``octavo.cpu.kernels.gemv``), when they are built here.
- more rows, with the kernels built for AVX-512: their panel GEMM
  (``octavo.cpu.kernels.gemm``) on a copy of the weight packed into 32-column panels. It
  streams bf16 and multiplies in fp32 FMAs. On CPUs whose bf16 arrives by AVX512-BF16 alone
  (``vdpbf16ps`` does half the multiply-adds per cycle of fp32 FMAs there) it runs at
  1.4-1.7x oneDNN's bf16 GEMM on SmolLM2-135M's layers from T=32 up, and from 0.94x (T=256
  to 2048) to 1.25x (T=8192, a full prefill chunk) an fp32 GEMM on an fp32 copy of the
  weight fed converted activations - without that copy's memory. With AMX tiles, oneDNN's
  bf16 GEMM is the faster from ``LARGE_ROWS`` rows.
- without the panel GEMM: oneDNN with the weight reordered once into its blocked layout
  (``mkldnn._reorder_linear_weight``), ~1.4x ``F.linear``'s bandwidth; from ``LARGE_ROWS``
  rows, where there are no AMX tiles, an fp32 copy of the weight also prepacked for oneDNN.
  oneDNN reorders bf16 weights only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT;
  elsewhere (an AVX2-only CPU) those rows take ``F.linear``.

Every path computes what a bf16 GEMM does - bf16 products accumulated in fp32, rounded to
bf16 once at the end - each in its own order.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from octavo.cpu import kernels as cpu_kernels

# Rows from which oneDNN's large-GEMM path beats the blocked bf16 weight (measured ~32 for
# SmolLM2-135M's layers, weights streamed from memory as in a decode step) or, with AMX,
# the panel GEMM (assumed the same: AMX was not measured).
LARGE_ROWS = 32


class CpuGemm:
    """``x @ weight.T + bias`` for one bf16 layer, on prepacked copies of its weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fp32_for_large: bool,
                 ) -> None:
        self.bias = bias
        self.weight = weight  # the layer's own tensor, not a copy
        self.panels = self.bias_panels = self.packed = self.packed32 = self.bias32 = None
        if cpu_kernels.gemm_available():
            self.panels = cpu_kernels.pack_gemm_weight(weight)
            self.bias_panels = None if bias is None else cpu_kernels.pack_gemm_bias(bias)
        elif fp32_for_large:
            self.packed32 = torch.ops.mkldnn._reorder_linear_weight(weight.float(), None)
            self.bias32 = None if bias is None else bias.float()
        if (self.panels is None or not fp32_for_large) and onednn_reorders_bf16():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        # The panel GEMM serves every row count unless AMX makes oneDNN's bf16 the faster.
        self.panel_rows = float("inf") if fp32_for_large else LARGE_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1] and x.is_contiguous() and cpu_kernels.usable(x):
            return cpu_kernels.gemv(x, self.weight, self.bias).view(*x.shape[:-1], -1)
        rows = x.numel() // x.shape[-1]
        if self.panels is not None and rows < self.panel_rows and cpu_kernels.usable(x):
            flat = x.reshape(rows, x.shape[-1])
            if flat.stride(-1) != 1:
                flat = flat.contiguous()
            y = cpu_kernels.gemm(flat, self.panels, self.bias_panels, self.weight.shape[0])
            return y.view(*x.shape[:-1], -1)
        if self.packed32 is not None and rows >= LARGE_ROWS:
            return _linear(x.float(), self.packed32, self.bias32).to(x.dtype)
        if self.packed is None:  # no bf16 reorder here, or the kernels were switched off
            return nn.functional.linear(x, self.weight, self.bias)
        return _linear(x, self.packed, self.bias)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear on a weight from ``_reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def onednn_reorders_bf16() -> bool:
    """Whether oneDNN can reorder a bf16 weight on this CPU (it raises on one without
    AVX-512 BW/VL/DQ or AVX-NE-CONVERT, e.g. an AVX2-only EPYC)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.ones(16, 16, dtype=torch.bfloat16), None)
    except RuntimeError:
        return False
    return True


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
