"""How a bf16 linear layer multiplies on the CPU.

``F.linear`` on bf16 tensors re-reads the weight in its plain ``[out, in]`` layout every
call. Faster paths, chosen once per layer by what the CPU has and per call by the number of
rows ``T`` (measured with ``benchmarks/cpu_gemm.py`` on SmolLM2-135M's layers; the tables
are in benchmarks/RESULTS.md):

- on a CPU with AVX512-BF16 (and the kernels built): the pair GEMM
  (``octavo.cpu.kernels.pair_gemm``) on a copy of the weight packed as bf16 pairs, for
  every row count - on an AVX512-BF16 EPYC it runs 1.0-2.6x oneDNN's blocked bf16 GEMM up
  to 64 rows, 0.95-1.03x from 128 to 2048 and 0.93-0.99x at 8192, and streams one row's
  weights ~1.5x faster than the GEMV - so it is the only copy kept. With AMX tiles (not
  measured here: no such CPU), oneDNN's bf16 GEMM on its blocked copy takes over from
  ``AMX_ONEDNN_ROWS`` rows.
- otherwise (bf16 chosen by hand: the default is fp32 there), below ``LARGE_ROWS`` rows
  with the kernels built for AVX-512: their panel GEMM
  (``octavo.cpu.kernels.gemm``) on a copy of the weight packed into 32-column panels, which
  streams bf16 and multiplies in fp32 FMAs; one row without it: the kernels' GEMV on the
  plain weight; below ``LARGE_ROWS``, where the panel GEMM is missing, oneDNN's bf16 where
  oneDNN can reorder bf16 weights (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; elsewhere
  ``F.linear``); from ``LARGE_ROWS`` an fp32 copy of the weight prepacked for oneDNN, fed
  converted activations.

Every path computes what a bf16 GEMM does - bf16 products accumulated in fp32, rounded to
bf16 once at the end - each in its own order.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Protocol, cast

import torch
from torch import nn

from octavo.cpu import kernels as cpu_kernels
from octavo.models.layers.linear import LinearBase

# With AMX, the rows from which oneDNN's bf16 GEMM (on the tiles) takes over the pair GEMM.
# A guess from oneDNN's AVX512-BF16 crossover with the panel GEMM (8 rows), not a
# measurement: no AMX CPU was at hand.
AMX_ONEDNN_ROWS = 8
# Without native bf16: rows from which an fp32 copy of the weight beats the bf16 paths.
LARGE_ROWS = 32


class CpuGemm:
    """``x @ weight.T + bias`` for one bf16 layer, on prepacked copies of its weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, native_bf16: bool,
                 amx: bool = False) -> None:
        self.bias = bias
        self.weight = weight  # the layer's own tensor, not a copy
        self.out_features = weight.shape[0]
        self.pairs = self.pair_bias = None
        self.panels = self.bias_panels = self.packed = self.packed32 = self.bias32 = None
        self.pair_rows = 0  # rows below which the pair GEMM serves
        if native_bf16 and cpu_kernels.pair_gemm_available() and weight.shape[1] % 2 == 0:
            self.pairs = cpu_kernels.pack_pair_weight(weight)
            self.pair_bias = (None if bias is None
                              else cpu_kernels.pack_bias(bias, cpu_kernels.PAIR_PANEL))
            self.pair_rows = AMX_ONEDNN_ROWS if amx else sys.maxsize
            if not amx:
                return
        elif cpu_kernels.gemm_available() and not native_bf16:
            self.panels = cpu_kernels.pack_gemm_weight(weight)
            self.bias_panels = (None if bias is None
                                else cpu_kernels.pack_bias(bias, cpu_kernels.GEMM_PANEL))
        if not native_bf16:
            self.packed32 = torch.ops.mkldnn._reorder_linear_weight(weight.float(), None)
            self.bias32 = None if bias is None else bias.float()
        if (native_bf16 or self.panels is None) and onednn_reorders_bf16():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows < self.pair_rows and self.pairs is not None and cpu_kernels.usable(x):
            y = cpu_kernels.pair_gemm(rows_of(x, rows), self.pairs, self.pair_bias,
                                      self.out_features)
            return y.view(*x.shape[:-1], -1)
        if self.weight.is_meta:
            raise RuntimeError(f"this layer's plain weight was released (the pair GEMM keeps "
                               f"the only copy), and the pair GEMM cannot take a "
                               f"{x.dtype} {x.device.type} input with the CPU kernels "
                               f"{'loaded' if cpu_kernels.library() else 'off'}")
        if self.panels is not None and rows < LARGE_ROWS and cpu_kernels.usable(x):
            y = cpu_kernels.gemm(rows_of(x, rows), self.panels, self.bias_panels,
                                 self.out_features)
            return y.view(*x.shape[:-1], -1)
        if self.panels is None and rows == 1 and x.is_contiguous() and cpu_kernels.usable(x):
            return cpu_kernels.gemv(x, self.weight, self.bias).view(*x.shape[:-1], -1)
        if self.packed32 is not None and rows >= LARGE_ROWS:
            return _linear(x.float(), self.packed32, self.bias32).to(x.dtype)
        if self.packed is None:  # no bf16 reorder here, or the kernels were switched off
            return nn.functional.linear(x, self.weight, self.bias)
        return _linear(x, self.packed, self.bias)

    @property
    def fuses_silu(self) -> bool:
        """Whether, as a gate/up projection (the gate's outputs, then the up's), the pair GEMM
        can apply SiLU-and-multiply itself: each half in whole panels."""
        return self.pairs is not None and self.out_features % (2 * cpu_kernels.PAIR_PANEL) == 0

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """For a gate/up projection: ``silu(gate) * up`` of ``x``'s projection in one pass of
        the pair GEMM, or None where that GEMM does not serve ``x`` (the caller then projects
        and multiplies in two steps)."""
        rows, d = x.numel() // x.shape[-1], self.out_features // 2
        if (self.pairs is None or not self.fuses_silu or rows >= self.pair_rows
                or not cpu_kernels.usable(x)):
            return None
        y = cpu_kernels.pair_gemm_silu(rows_of(x, rows), self.pairs, self.pair_bias, d)
        return y.view(*x.shape[:-1], d)

    @property
    def serves_every_call(self) -> bool:
        """Whether the pair GEMM takes every call: no path reads the plain weight."""
        return self.pairs is not None and self.pair_rows == sys.maxsize

    def release_weight(self) -> torch.Tensor:
        """Drop this object's hold on the plain weight (when it serves every call) and
        return a storage-less stand-in of its shape and dtype for the layer to keep."""
        assert self.serves_every_call, "a path of this GEMM reads the plain weight"
        self.weight = self.weight.to("meta")
        return self.weight


def rows_of(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` as ``[rows, in]`` with contiguous rows (a copy only when they are not)."""
    flat = x.reshape(rows, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


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


class GemmSlot(Protocol):
    """A layer a platform may give a faster GEMM: ``LinearBase``, ``ParallelLMHead``, a
    plugin's projection (found by their ``cpu_gemm`` attribute)."""

    weight: torch.Tensor
    cpu_gemm: Callable[[torch.Tensor], torch.Tensor] | None


def attach_cpu_gemms(model: nn.Module, native_bf16: bool, amx: bool = False) -> int:
    """Give every bf16 layer with a ``cpu_gemm`` slot its :class:`CpuGemm`, from the loaded
    weights (call it after loading; later weight changes are not seen). Returns how many.

    A linear layer whose every call its GEMM serves from the packed copy (the pair GEMM,
    and a layer that does not read its weight beside it) gives up its plain weight: one copy
    of the model's linear weights stays in memory, not two (SmolLM2-135M: 212 MB less). Its
    ``weight`` becomes a meta tensor of the same shape and dtype, so reading it fails loudly.
    Embeddings and heads keep theirs (a tied head's weight is the embedding table)."""
    attached = 0
    for module in model.modules():
        if not hasattr(module, "cpu_gemm"):
            continue
        slot = cast(GemmSlot, module)
        weight = slot.weight
        method = getattr(module, "quant_method", None)
        if (method is not None and not method.dense
                or not cpu_gemm_supported(weight.dtype, weight.device)):
            continue  # a quantized layer multiplies its own way
        bias = getattr(module, "bias", None)
        gemm = CpuGemm(weight.detach(), None if bias is None else bias.detach(), native_bf16,
                       amx)
        slot.cpu_gemm = gemm
        if (gemm.serves_every_call and isinstance(module, LinearBase)
                and not module.reads_weight_with_cpu_gemm()):
            module.weight = nn.Parameter(gemm.release_weight(), requires_grad=False)
        attached += 1
    return attached
