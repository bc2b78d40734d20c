"""RMSNorm (Llama's and Gemma's), optionally fused with the residual add that precedes it
in a decoder layer."""

from __future__ import annotations

import torch
from torch import nn

from octavo.models.layers.weights import new_parameter


class RMSNorm(nn.Module):
    """``weight * x / rms(x)`` over the last dimension, computed in fp32 as HF does.

    ``forward(x, residual)`` first adds ``residual`` to ``x`` and returns the normalised sum
    together with the sum, which is the next residual; this is how decoder layers chain
    without a separate add.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_parameter(hidden_size)

    def _unit_rms(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self._unit_rms(x).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._normalize(x)
        x = x + residual
        return self._normalize(x), x


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: ``x / rms(x) * (1 + weight)``, all in fp32 and rounded to the input's
    dtype only at the end (Llama's ``RMSNorm`` rounds before the weight), as HF Gemma does.

    Checkpoints store ``weight`` centred on 0; the fused residual add is ``RMSNorm``'s.
    """

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (self._unit_rms(x) * (1.0 + self.weight.float())).to(x.dtype)
