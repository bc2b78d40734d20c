"""Rotary position embedding, "neox" style (rotate halves) as HF Llama, with linear and
llama3 frequency scaling.

cos/sin are computed from the positions on the fly in fp32, with the same arithmetic as HF,
so positions have no upper bound and results match HF bit for bit in fp32.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from octavo.models.config import RopeConfig


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Inverse frequencies ``[head_dim / 2]`` (fp32) for the rope type of ``rope``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, blend in between."""
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to ``q [T, heads, head_dim]`` and ``k [T, kv_heads, head_dim]``
    at ``positions [T]``.

    One instance serves every layer of a model: cos/sin depend only on the positions, so they
    are computed once per forward pass (for the first layer) and reused by the others.
    """

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, rope), persistent=False)
        self._cached: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and the signed ``sin`` (``-sin`` on the first half) ``[T, 1, head_dim]`` in
        ``dtype``: ``x * cos + roll(x, head_dim / 2) * sin`` is HF's rotate-half formula."""
        cached = self._cached
        if cached is not None and cached[0] is positions and cached[1] == dtype:
            return cached[2], cached[3]
        freqs = positions[:, None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
        cos = angles.cos().to(dtype)
        sin = angles.sin()
        half = sin.shape[-1] // 2
        sin[..., :half].neg_()
        sin = sin.to(dtype)
        self._cached = (positions, dtype, cos, sin)
        return cos, sin

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(positions, q.dtype)
        half = q.shape[-1] // 2
        return (q * cos + q.roll(half, dims=-1) * sin, k * cos + k.roll(half, dims=-1) * sin)
