"""Activations of gated MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` where the input is ``[..., 2 * d]`` = gate and up side by side (the
    output layout of a fused gate/up projection)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(nn.Module):
    """``gelu(gate) * up`` on the same ``[..., 2 * d]`` layout (Gemma's GeGLU); ``approximate``
    is torch's: ``"tanh"`` for HF's ``gelu_pytorch_tanh``, ``"none"`` for the exact erf."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximation {approximate!r} is not one of 'none', 'tanh'")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up
