"""The two LoRA kernels every platform implements, here for the CPU (portable torch).

A step's tokens each run with one adapter slot (``token_lora[t]``, -1: the base model
alone). ``y += scale * (x @ A^T) @ B^T`` is computed in two halves, vLLM V1's contract:
``lora_shrink`` (``x [T, in]`` to ``[T, R]`` through the slots' A) and ``lora_expand``
(``[T, R]`` to a column range of ``y`` through the slots' B). A packed projection (qkv,
gate_up) calls the pair once per slice. The Triton kernels (octavo-triton) keep the same
signatures, so a platform swaps them in (``Platform.lora_kernels``).

Both take the step's tokens grouped by slot (:class:`TokenGroups`, vLLM's
``LoRAKernelMeta``): the model runner groups them once per step (``group_tokens``), and
every wrapped layer of the step reads that grouping; called without it, a kernel groups
the map itself. The versions here make one matmul per adapter present: a decode step of 64
requests on 8 adapters is 8 small GEMMs, not 64 matrix-vector products. The CPU platform
swaps in its C kernels (``octavo.cpu.lora``), which do the same without PyTorch's per-op
costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class TokenGroups:
    """A step's tokens grouped by adapter slot (the fields of the Triton kernels' grouping):
    ``sorted_tokens`` [T] int32, the token indices in slot order (tokens without an adapter
    first, each slot's in step order); ``counts`` and ``starts`` [L] int32, each slot's
    number of tokens and first position in ``sorted_tokens``."""

    sorted_tokens: torch.Tensor
    counts: torch.Tensor
    starts: torch.Tensor

    def slots(self) -> list[tuple[int, torch.Tensor]]:
        """``(slot, token indices)`` for every slot with tokens."""
        return [(slot, self.sorted_tokens[start:start + count].long())
                for slot, (start, count) in enumerate(zip(self.starts.tolist(),
                                                          self.counts.tolist())) if count]


def group_tokens(token_lora: torch.Tensor, num_slots: int) -> TokenGroups:
    """``token_lora`` (int32 [T] on the host, values -1 .. num_slots - 1) grouped by slot."""
    lora = token_lora.numpy()
    order = np.argsort(lora, kind="stable").astype(np.int32)
    counts = np.bincount(lora + 1, minlength=num_slots + 1).astype(np.int32)
    starts = (np.cumsum(counts) - counts).astype(np.int32)
    return TokenGroups(torch.from_numpy(order), torch.from_numpy(counts[1:]),
                       torch.from_numpy(starts[1:]))


class Shrink(Protocol):
    def __call__(self, x: torch.Tensor, lora_a: torch.Tensor, token_lora: torch.Tensor,
                 out: torch.Tensor, scale: float, groups: TokenGroups | None = None) -> None:
        ...


class Expand(Protocol):
    def __call__(self, y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor,
                 token_lora: torch.Tensor, offset: int, size: int,
                 groups: TokenGroups | None = None) -> None:
        ...


class LayerDelta(Protocol):
    """A wrapped layer's whole delta, ``y += (x A_s^T) B_s^T`` over all its slices, in one
    call; False where it cannot take ``x`` or ``y`` (the caller then runs shrink/expand)."""

    def __call__(self, x: torch.Tensor, y: torch.Tensor, groups: TokenGroups) -> bool:
        ...


class BindDelta(Protocol):
    """A platform's :class:`LayerDelta` for a layer's stacks ``a [slices, L, R, in]`` and
    ``b [L, out, R]`` and its slices' ``(offset, size)`` columns, made once when the layer is
    wrapped (the stacks are filled in place afterwards); None where it cannot take them."""

    def __call__(self, a: torch.Tensor, b: torch.Tensor,
                 slices: Sequence[tuple[int, int]]) -> LayerDelta | None:
        ...


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_lora: torch.Tensor,
                out: torch.Tensor, scale: float, groups: TokenGroups | None = None) -> None:
    """``out[t] = scale * lora_a[s] @ x[t]`` (float32) for ``s = token_lora[t] >= 0``;
    rows of tokens without an adapter are 0. ``lora_a [L, R, in]``, ``out [T, R]``."""
    out.zero_()
    for slot, rows in (groups or group_tokens(token_lora, lora_a.shape[0])).slots():
        product = x.index_select(0, rows).float() @ lora_a[slot].float().t()
        out.index_copy_(0, rows, product.mul_(scale) if scale != 1.0 else product)


def lora_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor,
                token_lora: torch.Tensor, offset: int, size: int,
                groups: TokenGroups | None = None) -> None:
    """``y[t, offset:offset+size] += lora_b[s] @ buf[t]`` for ``s = token_lora[t] >= 0``
    (``lora_b [L, size, R]``, ``buf [T, R]`` float32), in ``y``'s dtype."""
    present = (groups or group_tokens(token_lora, lora_b.shape[0])).slots()
    if not present:
        return
    # The groups' products gathered into one dense delta, added to y's columns at once:
    # index_add_ straight into y's strided column range is several times slower.
    delta = torch.zeros(y.shape[0], size, dtype=torch.float32, device=y.device)
    for slot, rows in present:
        delta.index_copy_(0, rows, buf.index_select(0, rows) @ lora_b[slot].float().t())
    y.narrow(1, offset, size).add_(delta.to(y.dtype))
