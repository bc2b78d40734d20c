"""Multi-LoRA shrink and expand: the two GEMMs of a LoRA delta for a batch whose tokens use
different adapters (or none), in the style of vLLM V1's ``lora_shrink``/``lora_expand``
(vllm/lora/ops/triton_ops).

``lora_shrink`` computes ``out[t] = scale * lora_a[s] @ x[t]`` (``[T, R]``, float32) and
``lora_expand`` adds ``lora_b[s] @ buf[t]`` into a column slice of ``y``, where ``s`` is
token ``t``'s adapter slot and ``-1`` means no adapter. Adapters of smaller rank are
zero-padded to the slots' rank ``R``.

The launch grid is ``(token blocks, column blocks, slots)`` and depends only on the
shapes, never on which token uses which adapter: the token->slot map is turned on the
device (:func:`group_tokens_by_lora`, torch ops without a host sync) into the token
indices sorted by slot, each slot's count and start. A program of slot ``s`` takes the
``BLOCK_M`` tokens of its block among ``s``'s and returns at once when there are fewer -
so a launch can be recorded in a CUDA graph and replayed for any map.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # tokens per program (tl.dot's smallest tile)
MAX_BLOCK_N = 64
BLOCK_K = 32


@dataclass(frozen=True)
class TokenGroups:
    """Tokens grouped by adapter slot: ``sorted_tokens`` [T] int32, the token indices in
    slot order (tokens without an adapter first); ``counts`` and ``starts`` [L] int32,
    each slot's number of tokens and first position in ``sorted_tokens``."""

    sorted_tokens: torch.Tensor
    counts: torch.Tensor
    starts: torch.Tensor


def group_tokens_by_lora(token_lora: torch.Tensor, num_slots: int) -> TokenGroups:
    """The grouping both kernels read; shrink and expand of one step can share it. Every
    shape here is fixed by ``T`` and ``num_slots`` (no ``bincount``, whose size depends on
    the values and costs a host sync), so a CUDA graph can capture it too."""
    sorted_tokens = torch.argsort(token_lora, stable=True).to(torch.int32)
    slots = torch.arange(num_slots, dtype=token_lora.dtype, device=token_lora.device)
    counts = (token_lora[None, :] == slots[:, None]).sum(1)
    without = (token_lora < 0).sum(0, keepdim=True)
    starts = without + torch.cumsum(counts, 0) - counts
    return TokenGroups(sorted_tokens, counts.to(torch.int32), starts.to(torch.int32))


@triton.jit
def slot_tokens(sorted_ptr, counts_ptr, starts_ptr, BLOCK_M: tl.constexpr):
    """This program's slot, the slot's token count, the program's positions ``m`` among
    the slot's tokens and the token indices there (0 past the count)."""
    slot = tl.program_id(2)
    count = tl.load(counts_ptr + slot)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tokens = tl.load(sorted_ptr + tl.load(starts_ptr + slot) + m, mask=m < count, other=0)
    return slot, count, m, tokens.to(tl.int64)


@triton.jit
def lora_shrink_kernel(out_ptr, x_ptr, a_ptr, sorted_ptr, counts_ptr, starts_ptr,
                       in_features, rank, stride_x, stride_a_slot, stride_a_row, stride_out,
                       scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    slot, count, m, tokens = slot_tokens(sorted_ptr, counts_ptr, starts_ptr, BLOCK_M)
    if tl.program_id(0) * BLOCK_M < count:  # else the slot has no tokens in this block
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K)
        x_rows = x_ptr + tokens[:, None] * stride_x
        a_cols = a_ptr + slot.to(tl.int64) * stride_a_slot + n[None, :] * stride_a_row
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, in_features, BLOCK_K):
            kk = k0 + k
            x = tl.load(x_rows + kk[None, :], mask=(m[:, None] < count)
                        & (kk[None, :] < in_features), other=0.0)
            a = tl.load(a_cols + kk[:, None], mask=(kk[:, None] < in_features)
                        & (n[None, :] < rank), other=0.0)
            acc += tl.dot(x, a.to(x.dtype), input_precision="ieee")  # fp32: no tf32
        tl.store(out_ptr + tokens[:, None] * stride_out + n[None, :], acc * scale,
                 mask=(m[:, None] < count) & (n[None, :] < rank))


@triton.jit
def lora_expand_kernel(y_ptr, buf_ptr, b_ptr, sorted_ptr, counts_ptr, starts_ptr,
                       offset, size, rank, stride_y, stride_buf, stride_b_slot, stride_b_row,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RANK_PAD: tl.constexpr):
    slot, count, m, tokens = slot_tokens(sorted_ptr, counts_ptr, starts_ptr, BLOCK_M)
    if tl.program_id(0) * BLOCK_M < count:  # else the slot has no tokens in this block
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        r = tl.arange(0, RANK_PAD)
        buf = tl.load(buf_ptr + tokens[:, None] * stride_buf + r[None, :],
                      mask=(m[:, None] < count) & (r[None, :] < rank), other=0.0)
        b = tl.load(b_ptr + slot.to(tl.int64) * stride_b_slot + n[None, :] * stride_b_row
                    + r[:, None], mask=(r[:, None] < rank) & (n[None, :] < size), other=0.0)
        # The rank-R intermediate is rounded to the adapter's dtype, as vLLM's expand does.
        delta = tl.dot(buf.to(b.dtype), b, input_precision="ieee")
        mask = (m[:, None] < count) & (n[None, :] < size)
        dst = y_ptr + tokens[:, None] * stride_y + offset + n[None, :]
        y = tl.load(dst, mask=mask, other=0.0)
        tl.store(dst, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=mask)


def _dense_rows(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with a dense last dimension, which the kernels index without a stride."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _grid(num_tokens: int, columns: int, num_slots: int) -> tuple[tuple[int, int, int], int]:
    """The launch grid (token blocks, column blocks, slots) - shapes only, never the map -
    and the column block."""
    block_n = min(MAX_BLOCK_N, max(16, triton.next_power_of_2(columns)))
    return (triton.cdiv(num_tokens, BLOCK_M), triton.cdiv(columns, block_n), num_slots), block_n


def _check_map(token_lora: torch.Tensor, num_tokens: int) -> None:
    if token_lora.shape != (num_tokens,):
        raise ValueError(f"token_lora {tuple(token_lora.shape)} must be [{num_tokens}]: "
                         "one adapter slot per token")


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_lora: torch.Tensor,
                out: torch.Tensor, scale: float, groups: TokenGroups | None = None) -> None:
    """``out[t] = scale * lora_a[s] @ x[t]`` for ``x`` [T, in], ``lora_a`` [L, R, in] and
    ``out`` [T, R] float32; rows of tokens with slot -1 are zero. ``groups``: the
    grouping of ``token_lora`` when the caller already has it."""
    num_tokens, in_features = x.shape
    num_slots, rank, a_in = lora_a.shape
    _check_map(token_lora, num_tokens)
    if a_in != in_features or out.shape != (num_tokens, rank) or out.dtype != torch.float32:
        raise ValueError(f"lora_shrink: x {tuple(x.shape)}, lora_a {tuple(lora_a.shape)} and "
                         f"out {tuple(out.shape)} {out.dtype} do not fit "
                         "(x [T, in], lora_a [L, R, in], out [T, R] float32)")
    out.zero_()
    if num_tokens == 0 or num_slots == 0:
        return
    groups = groups or group_tokens_by_lora(token_lora, num_slots)
    x, lora_a = _dense_rows(x), _dense_rows(lora_a)
    grid, block_n = _grid(num_tokens, rank, num_slots)
    lora_shrink_kernel[grid](
        out, x, lora_a, groups.sorted_tokens, groups.counts, groups.starts, in_features, rank,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0), scale,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K)


def lora_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor,
                token_lora: torch.Tensor, offset: int, size: int,
                groups: TokenGroups | None = None) -> None:
    """``y[t, offset:offset+size] += lora_b[s] @ buf[t]`` in place, for tokens with a slot
    ``s >= 0``; ``y`` [T, out_total], ``buf`` [T, R], ``lora_b`` [L, size, R]."""
    num_tokens = y.shape[0]
    num_slots, b_size, rank = lora_b.shape
    _check_map(token_lora, num_tokens)
    if (b_size != size or buf.shape != (num_tokens, rank) or offset < 0
            or offset + size > y.shape[1]):
        raise ValueError(f"lora_expand: y {tuple(y.shape)}, buf {tuple(buf.shape)}, lora_b "
                         f"{tuple(lora_b.shape)}, offset {offset} and size {size} do not fit "
                         "(buf [T, R], lora_b [L, size, R], offset + size <= y's columns)")
    if y.stride(-1) != 1:
        raise ValueError("lora_expand adds into y in place: its last dimension must be dense")
    if num_tokens == 0 or num_slots == 0 or size == 0:
        return
    groups = groups or group_tokens_by_lora(token_lora, num_slots)
    buf, lora_b = _dense_rows(buf), _dense_rows(lora_b)
    grid, block_n = _grid(num_tokens, size, num_slots)
    lora_expand_kernel[grid](
        y, buf, lora_b, groups.sorted_tokens, groups.counts, groups.starts, offset, size, rank,
        y.stride(0), buf.stride(0), lora_b.stride(0), lora_b.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, RANK_PAD=max(16, triton.next_power_of_2(rank)))
