"""The model layers that have an NKI kernel, switched onto it (as ``octavo_triton.layers``
does for Triton).

:func:`use_nki_layers` turns each ``RMSNorm``, ``RotaryEmbedding`` and ``SiluAndMul`` of
a built model into the subclass below, whose ``forward`` runs the kernel: parameters,
buffers and weight loading stay the portable layer's, and the kernels round where it
rounds, so the model computes the same thing (in emulation: on the CPU, slowly).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.plugin_api import RMSNorm, RotaryEmbedding, SiluAndMul, switch_layers
from octavo_neuron.kernels import rms_norm, rotary_embedding, silu_and_mul


class NkiRMSNorm(RMSNorm):
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.weight, self.eps, residual)


class NkiRotaryEmbedding(RotaryEmbedding):
    inv_freq: torch.Tensor  # the buffer of the portable layer (its rope scaling included)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        del lengths  # the plain frequencies do not depend on them
        return rotary_embedding(positions, q, k, self.inv_freq)


class NkiSiluAndMul(SiluAndMul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


NKI_LAYERS: dict[type[nn.Module], type[nn.Module]] = {
    RMSNorm: NkiRMSNorm,
    RotaryEmbedding: NkiRotaryEmbedding,
    SiluAndMul: NkiSiluAndMul,
}


def use_nki_layers(model: nn.Module) -> int:
    """Switch every portable layer of ``model`` that has a kernel onto it; returns how many
    modules were switched."""
    return switch_layers(model, NKI_LAYERS)
