"""The model layers that have a Triton kernel, switched onto it.

The portable model (``octavo.models``) is built from ``RMSNorm``, ``RotaryEmbedding`` and
``SiluAndMul`` modules written in plain torch. :func:`use_triton_layers` turns each such
module of a built model into the subclass below, whose ``forward`` launches the kernel:
the parameters, buffers and weight loading stay those of the portable layer, and the
kernels reproduce its arithmetic, so a model is the same model either way - only faster
on a GPU (one launch instead of several element-wise ops each).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.plugin_api import RMSNorm, RotaryEmbedding, SiluAndMul, switch_layers
from octavo_triton.kernels.activation import silu_and_mul
from octavo_triton.kernels.rms_norm import rms_norm
from octavo_triton.kernels.rotary import rotary_embedding


class TritonRMSNorm(RMSNorm):
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.weight, self.eps, residual)


class TritonRotaryEmbedding(RotaryEmbedding):
    inv_freq: torch.Tensor  # the buffer of the portable layer

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        del lengths  # the plain frequencies do not depend on them
        return rotary_embedding(positions, q, k, self.inv_freq)


class TritonSiluAndMul(SiluAndMul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


TRITON_LAYERS: dict[type[nn.Module], type[nn.Module]] = {
    RMSNorm: TritonRMSNorm,
    RotaryEmbedding: TritonRotaryEmbedding,
    SiluAndMul: TritonSiluAndMul,
}


def use_triton_layers(model: nn.Module) -> int:
    """Switch every portable layer of ``model`` that has a kernel onto it; returns how many
    modules were switched."""
    return switch_layers(model, TRITON_LAYERS)
