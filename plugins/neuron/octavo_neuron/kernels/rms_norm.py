"""RMSNorm with the optional residual add before it (``octavo.models.layers.norm.RMSNorm``).

Rows go 128 to a tile, one row per partition, so the mean of squares is a free-axis
reduction; the last tile is masked rather than shrunk so every tile has one shape.
"""

from __future__ import annotations

import torch

from octavo_neuron.nki import nki, nl

from ._torch import PMAX, as_torch


@nki.jit
def rms_norm_kernel(x, weight, eps, residual=None):
    """``x`` [N, D], ``weight`` [D] -> ``out`` [N, D] (and ``x + residual`` when given),
    computed in fp32 with the reference's roundings to ``x.dtype``."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    summed = None if residual is None else nl.ndarray((n, d), dtype=x.dtype,
                                                      buffer=nl.shared_hbm)
    i_p = nl.arange(PMAX)[:, None]
    i_f = nl.arange(d)[None, :]
    w_tile = nl.load(weight.reshape((1, d))[0 * i_f, i_f]).broadcast_to((PMAX, d))
    for tile in nl.affine_range((n + PMAX - 1) // PMAX):
        rows = tile * PMAX + i_p
        valid = rows < n
        x_tile = nl.load(x[rows, i_f], mask=valid)
        if residual is not None:
            x_tile = nl.add(x_tile, nl.load(residual[rows, i_f], mask=valid), dtype=x.dtype)
            nl.store(summed[rows, i_f], x_tile, mask=valid)
        squares = nl.multiply(x_tile, x_tile, dtype=nl.float32)
        mean = nl.multiply(nl.sum(squares, axis=1, keepdims=True), 1.0 / d)
        rstd = nl.rsqrt(nl.add(mean, eps))
        normed = nl.multiply(x_tile, rstd, dtype=x.dtype)
        nl.store(out[rows, i_f], nl.multiply(normed, w_tile, dtype=x.dtype), mask=valid)
    return out if residual is None else (out, summed)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``RMSNorm.forward``: the normalised ``x`` (``[..., D]``), or with ``residual`` the
    normalised ``x + residual`` and that sum (the next residual)."""
    flat = x.reshape(-1, x.shape[-1])
    if residual is None:
        return as_torch(rms_norm_kernel(flat, weight, eps), x).reshape(x.shape)
    out, summed = rms_norm_kernel(flat, weight, eps, residual.reshape(flat.shape))
    return as_torch(out, x).reshape(x.shape), as_torch(summed, x).reshape(x.shape)
