"""The two LoRA kernels every platform implements, here for the CPU (portable torch).

A step's tokens each run with one adapter slot (``token_lora[t]``, -1: the base model
alone). ``y += scale * (x @ A^T) @ B^T`` is computed in two halves, vLLM V1's contract:
``lora_shrink`` (``x [T, in]`` to ``[T, R]`` through the slots' A) and ``lora_expand``
(``[T, R]`` to a column range of ``y`` through the slots' B). A packed projection (qkv,
gate_up) calls the pair once per slice. The Triton kernels (octavo-triton) keep the same
signatures, so a platform swaps them in (``Platform.lora_kernels``).

The CPU versions group a step's tokens by slot and make one matmul per adapter present:
a decode step of 64 requests on 8 adapters is 8 small GEMMs, not 64 matrix-vector products
(``benchmarks/lora_ops.py`` measures them against one masked matmul per slot).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Shrink = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], None]
Expand = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int], None]


# The last map grouped and its groups: every wrapped layer of a step passes the same map
# (a new tensor each step, never written after), so it is grouped once per step. Holding
# the tensor keeps its identity from being reused by another.
_grouped: list = [None, []]


def slot_groups(token_lora: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``(slot, token indices)`` for every slot present in ``token_lora`` (not -1)."""
    if _grouped[0] is token_lora:
        return _grouped[1]
    slots = torch.unique(token_lora)
    groups = [(int(slot), torch.nonzero(token_lora == slot).squeeze(1))
              for slot in slots.tolist() if slot >= 0]
    _grouped[0], _grouped[1] = token_lora, groups
    return groups


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_lora: torch.Tensor,
                out: torch.Tensor, scale: float) -> None:
    """``out[t] = scale * lora_a[s] @ x[t]`` (float32) for ``s = token_lora[t] >= 0``;
    rows of tokens without an adapter are 0. ``lora_a [L, R, in]``, ``out [T, R]``."""
    out.zero_()
    for slot, rows in slot_groups(token_lora):
        product = x.index_select(0, rows).float() @ lora_a[slot].float().t()
        out.index_copy_(0, rows, product.mul_(scale) if scale != 1.0 else product)


def lora_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor,
                token_lora: torch.Tensor, offset: int, size: int) -> None:
    """``y[t, offset:offset+size] += lora_b[s] @ buf[t]`` for ``s = token_lora[t] >= 0``
    (``lora_b [L, size, R]``, ``buf [T, R]`` float32), in ``y``'s dtype."""
    groups = slot_groups(token_lora)
    if not groups:
        return
    # The groups' products gathered into one dense delta, added to y's columns at once:
    # index_add_ straight into y's strided column range is several times slower.
    delta = torch.zeros(y.shape[0], size, dtype=torch.float32, device=y.device)
    for slot, rows in groups:
        delta.index_copy_(0, rows, buf.index_select(0, rows) @ lora_b[slot].float().t())
    y.narrow(1, offset, size).add_(delta.to(y.dtype))
