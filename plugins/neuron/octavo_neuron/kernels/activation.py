"""SiLU-and-mul of gated MLPs (``octavo.models.layers.activation.SiluAndMul``)."""

from __future__ import annotations

import torch

from octavo_neuron.nki import nki, nl

from ._torch import PMAX, as_torch


@nki.jit
def silu_and_mul_kernel(x):
    """``x`` [N, 2d] (gate and up side by side) -> ``silu(gate) * up`` [N, d], rounded to
    ``x.dtype`` after the silu and after the product as the reference is."""
    n, width = x.shape
    d = width // 2
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(PMAX)[:, None]
    i_f = nl.arange(d)[None, :]
    for tile in nl.affine_range((n + PMAX - 1) // PMAX):
        rows = tile * PMAX + i_p
        valid = rows < n
        gate = nl.load(x[rows, i_f], mask=valid)
        up = nl.load(x[rows, d + i_f], mask=valid)
        result = nl.multiply(nl.silu(gate, dtype=x.dtype), up, dtype=x.dtype)
        nl.store(out[rows, i_f], result, mask=valid)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``SiluAndMul.forward`` for ``x`` [..., 2d]."""
    flat = x.reshape(-1, x.shape[-1])
    return as_torch(silu_and_mul_kernel(flat), x).reshape(*x.shape[:-1], x.shape[-1] // 2)
