"""How a bf16 linear layer multiplies on the CPU.

``F.linear`` on bf16 tensors re-reads the weight in its plain ``[out, in]`` layout every
call. Faster paths, chosen per call by the number of rows ``T`` (measured with
``benchmarks/cpu_gemm.py`` on SmolLM2-135M's layers; the table is in benchmarks/RESULTS.md):

- up to a few rows (``T < PANEL_MAX_ROWS``), with the kernels built for AVX-512: their
  panel GEMM (``octavo.cpu.kernels.gemm``) on a copy of the weight packed into 32-column
  panels, which streams bf16 and multiplies in fp32 FMAs; from 4-8 rows it falls behind.
  At one row it streams the weights ~18% faster than the GEMV (W2 1.37x end to end).
- one row without the panel GEMM: the fused CPU kernels' GEMV on the plain weight
  (``octavo.cpu.kernels.gemv``), when they are built here.
- more rows, on a CPU with native bf16 (AVX512-BF16 or AMX): oneDNN's bf16 GEMM on the
  weight reordered once into its blocked layout (``mkldnn._reorder_linear_weight``):
  on an AVX512-BF16 CPU 1.04-2.2x ``F.linear``, and 0.9-1.5x the panel GEMM at 8 rows,
  1.2-1.7x at 16 and 1.9-3.1x from 64.
- more rows, on a CPU without native bf16 (bf16 chosen by hand; the default is fp32
  there): below ``LARGE_ROWS`` the panel GEMM or, without it, oneDNN's bf16 where oneDNN
  can reorder bf16 weights (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; elsewhere ``F.linear``);
  from ``LARGE_ROWS`` an fp32 copy of the weight prepacked for oneDNN, fed converted
  activations.

Every path computes what a bf16 GEMM does - bf16 products accumulated in fp32, rounded to
bf16 once at the end - each in its own order.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from octavo.cpu import kernels as cpu_kernels

# Rows below which the panel GEMM beats oneDNN's blocked bf16 weight on an AVX512-BF16 CPU
# (2 threads, SmolLM2-135M's layers: it wins at 2 and 4 rows, loses from 8).
PANEL_MAX_ROWS = 8
# Rows from which, without native bf16, an fp32 copy of the weight beats the bf16 paths.
LARGE_ROWS = 32


class CpuGemm:
    """``x @ weight.T + bias`` for one bf16 layer, on prepacked copies of its weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, native_bf16: bool,
                 ) -> None:
        self.bias = bias
        self.weight = weight  # the layer's own tensor, not a copy
        self.panels = self.bias_panels = self.packed = self.packed32 = self.bias32 = None
        if cpu_kernels.gemm_available():
            self.panels = cpu_kernels.pack_gemm_weight(weight)
            self.bias_panels = None if bias is None else cpu_kernels.pack_gemm_bias(bias)
        if not native_bf16:
            self.packed32 = torch.ops.mkldnn._reorder_linear_weight(weight.float(), None)
            self.bias32 = None if bias is None else bias.float()
        if (native_bf16 or self.panels is None) and onednn_reorders_bf16():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        # Native bf16: oneDNN's from a few rows. Otherwise the panel GEMM up to the fp32 copy.
        self.panel_rows = PANEL_MAX_ROWS if native_bf16 else LARGE_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (self.panels is None and x.numel() == x.shape[-1] and x.is_contiguous()
                and cpu_kernels.usable(x)):
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


def attach_cpu_gemms(model: nn.Module, native_bf16: bool) -> int:
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
                                  native_bf16)
        attached += 1
    return attached
