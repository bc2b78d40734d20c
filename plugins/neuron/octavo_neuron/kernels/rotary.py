"""Neox-style rotary embedding (``octavo.models.layers.rotary.RotaryEmbedding``, whose
``inv_freq`` carries the rope type's scaling): rotate the two halves of every head by the
position's angles.

Tokens go 128 to a tile; the angles ``position * inv_freq`` are computed once per tile in
fp32 (as the reference does) and serve every query and key head.
"""

from __future__ import annotations

import torch

from octavo_neuron.nki import nki, nl

from ._torch import PMAX, as_torch


@nki.jit
def rotary_kernel(positions, q, k, inv_freq):
    """``positions`` [T], ``q`` [T, H, D], ``k`` [T, KVH, D], ``inv_freq`` [D/2] fp32 ->
    the rotated ``q`` and ``k``; cos/sin and the products are rounded to ``q.dtype`` as
    the reference rounds them."""
    num_tokens, _, head_dim = q.shape
    half = head_dim // 2
    q_out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    k_out = nl.ndarray(k.shape, dtype=k.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(PMAX)[:, None]
    i_h = nl.arange(half)[None, :]
    freq = nl.load(inv_freq.reshape((1, half))[0 * i_h, i_h]).broadcast_to((PMAX, half))
    for tile in nl.affine_range((num_tokens + PMAX - 1) // PMAX):
        rows = tile * PMAX + i_p
        valid = rows < num_tokens
        angles = nl.multiply(nl.load(positions[rows], mask=valid), freq, dtype=nl.float32)
        cos = nl.cos(angles, dtype=q.dtype)
        sin = nl.sin(angles, dtype=q.dtype)
        for src, dst in ((q, q_out), (k, k_out)):
            for head in nl.affine_range(src.shape[1]):
                _rotate(src, dst, rows, head, i_h, half, cos, sin, valid)
    return q_out, k_out


def _rotate(src, dst, rows, head, i_h, half, cos, sin, valid) -> None:
    """``[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]`` for one head of one token tile."""
    x1 = nl.load(src[rows, head, i_h], mask=valid)
    x2 = nl.load(src[rows, head, half + i_h], mask=valid)
    dtype = src.dtype
    first = nl.subtract(nl.multiply(x1, cos, dtype=dtype), nl.multiply(x2, sin, dtype=dtype),
                        dtype=dtype)
    second = nl.add(nl.multiply(x2, cos, dtype=dtype), nl.multiply(x1, sin, dtype=dtype),
                    dtype=dtype)
    nl.store(dst[rows, head, i_h], first, mask=valid)
    nl.store(dst[rows, head, half + i_h], second, mask=valid)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``RotaryEmbedding.forward(positions, q, k)`` for ``q`` [T, H, D], ``k`` [T, KVH, D]
    with that layer's ``inv_freq`` [D/2] (fp32; any rope scaling is already in it)."""
    q_out, k_out = rotary_kernel(positions.to(torch.int32), q, k, inv_freq.float())
    return as_torch(q_out, q), as_torch(k_out, k)
