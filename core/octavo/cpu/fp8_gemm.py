"""fp8 checkpoints' linear layers multiplied by the CPU's fp8 pair GEMM (``octavo_fp8_pair_gemm``
in cpu_ops.c).

An fp8 layer (``octavo.models.layers.checkpoint_methods.Fp8LinearMethod``: e4m3 weights and a
scale per tensor or output row) computes on the portable path by dequantizing its whole weight
every call. On a CPU with AVX512-BF16, in a bf16 model, the platform gives it a ``cpu_gemm``
on a copy of its bytes packed as the bf16 pair GEMM's panels: the weights stream from memory
at one byte each and widen to bf16 in registers, exactly, so the result is the bf16 GEMM's on
the dequantized weight (the scale multiplies each column's fp32 sums before the bias and the
single rounding). The copy replaces the layer's own fp8 weight, as the bf16 pair GEMM's does.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from octavo.cpu import kernels as cpu_kernels
from octavo.cpu.gemm import GemmSlot, rows_of
from octavo.models.layers.checkpoint_methods import FP8_E4M3, Fp8LinearMethod
from octavo.models.layers.linear import LinearBase


class Fp8Gemm:
    """``(x @ weight.T) * scale + bias`` for one fp8 layer, on its packed bytes; bf16 rows in,
    bf16 rows out."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        assert weight.dtype == FP8_E4M3 and weight.shape[1] % 2 == 0
        self.out_features = weight.shape[0]
        self.packed = cpu_kernels.pack_pair_weight(weight.view(torch.uint8))
        self.scale32 = cpu_kernels.pack_bias(scale.reshape(-1), cpu_kernels.PAIR_PANEL)
        self.bias32 = None if bias is None else cpu_kernels.pack_bias(bias,
                                                                       cpu_kernels.PAIR_PANEL)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not cpu_kernels.usable(x):
            raise TypeError(f"the fp8 GEMM takes bf16 CPU rows with the kernels loaded, not "
                            f"{x.dtype} on {x.device.type}")
        rows = x.numel() // x.shape[-1]
        y = cpu_kernels.fp8_pair_gemm(rows_of(x, rows), self.packed, self.scale32,
                                      self.bias32, self.out_features)
        return y.view(*x.shape[:-1], -1)


def attach_fp8_gemms(model: nn.Module) -> int:
    """Give every linear layer of a bf16 model holding fp8 weights an :class:`Fp8Gemm` where
    the pair GEMM is built here, and drop its own weight for the packed copy (a meta tensor of
    the same shape stays: reading it fails loudly). Call it after loading; returns how many."""
    if not cpu_kernels.pair_gemm_available():
        return 0
    attached = 0
    for module in model.modules():
        if not (isinstance(module, LinearBase)
                and isinstance(module.quant_method, Fp8LinearMethod)):
            continue
        weight = module.weight
        if weight.shape[1] % 2 or module.reads_weight_with_cpu_gemm():
            continue
        bias, scale = module.bias, cast(torch.Tensor, module.weight_scale)
        cast(GemmSlot, module).cpu_gemm = Fp8Gemm(weight.detach(), scale.detach(),
                                                  None if bias is None else bias.detach())
        module.weight = nn.Parameter(weight.detach().to("meta"), requires_grad=False)
        attached += 1
    return attached
