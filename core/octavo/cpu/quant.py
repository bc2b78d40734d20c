"""GGUF-quantized layers multiplied by the CPU's quantized kernels (``octavo.cpu.quant_gemm``).

A layer whose method keeps GGUF blocks (``octavo.models.layers.gguf``) computes on the
portable path by dequantizing its whole weight every call. Where the kernels are built and
serve the layer's type, the platform gives the layer a ``cpu_gemm`` that multiplies the
blocks as they are (decode steps in registers, prefills a dequantized panel at a time), in
fp32 or bf16 alike. The layer's blocks are the method's, handed over by its public
``quantized_weight``; nothing is copied.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from octavo.cpu.gemm import GemmSlot
from octavo.cpu.quant_gemm import (
    check_blocks,
    checked_matmul,
    decode_kernel,
    quant_kernels_available,
    quant_q8_available,
    quant_types,
)
from octavo.models.layers.gguf import GgufMethod, QuantizedWeight


class QuantGemm:
    """``x @ W.T (+ bias)`` for one layer on its GGUF blocks, checked and its decode kernel
    chosen once, here."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None,
                 perm: torch.Tensor | None = None) -> None:
        check_blocks(weight.blocks, weight.ggml_type, weight.rows, weight.cols)
        self.weight = weight
        self.bias = bias
        self.perm = perm  # the blocks' order of the input features (None: as given)
        self.kernel = decode_kernel(weight.ggml_type)
        # The fused decode stack's copy of the bias (cpu_layer.c adds fp32 biases).
        self.bias32 = None if bias is None else bias.float()

    @property
    def runs_in_fused_layers(self) -> bool:
        """Whether the fused decode stack (``octavo.cpu.decode_layer``) can multiply these
        blocks as this layer does: the input as given (no ``perm``), and the kernel it picks
        for the type (Q8 activations wherever the type has a VNNI kernel) the layer's own."""
        fused_kernel = ("octavo_quant_matmul_q8" if quant_q8_available(self.weight.ggml_type)
                        else "octavo_quant_matmul")
        return self.perm is None and self.kernel == fused_kernel

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        y = checked_matmul(x, w.blocks, w.ggml_type, w.rows, w.cols, self.kernel)
        return y if self.bias is None else y + self.bias


def attach_quant_gemms(model: nn.Module) -> int:
    """Give every layer on GGUF blocks of a type the kernels serve a :class:`QuantGemm`
    (in its ``cpu_gemm`` slot: linear layers and LM heads); returns how many. Call it after
    loading. Embedding lookups stay the method's (they dequantize only the rows they
    gather). A model with no such layer (every dense one) does not load or build the
    kernel library here."""
    quantized = [(module, weight) for module in model.modules()
                 if (weight := _quantized_weight(module)) is not None]
    if not quantized or not quant_kernels_available():
        return 0
    attached = 0
    for module, weight in quantized:
        if weight.ggml_type not in quant_types():
            continue
        bias = getattr(module, "bias", None)
        perm = cast(GgufMethod, module.quant_method).input_perm(module)
        cast(GemmSlot, module).cpu_gemm = QuantGemm(weight,
                                                    None if bias is None else bias.detach(),
                                                    perm)
        attached += 1
    return attached


def _quantized_weight(module: nn.Module) -> QuantizedWeight | None:
    """The GGUF blocks of ``module`` where it has a ``cpu_gemm`` slot; None otherwise."""
    method = getattr(module, "quant_method", None)
    if not hasattr(module, "cpu_gemm") or not isinstance(method, GgufMethod):
        return None
    return method.quantized_weight(module)
