"""Rotary position embedding, "neox" style (rotate halves), on queries and keys at once.

cos/sin come from ``position * inv_freq`` in fp32 as in ``octavo.models.layers.rotary``
(whose ``inv_freq`` already carries the model's RoPE scaling), then are rounded to the
model dtype, and each product and the sum are rounded where the portable layer rounds.
A program rotates every head of the query and key of ``TOKENS`` tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo_triton.tuning import active_tuning


@triton.jit
def _rotate(x_ptr, out_ptr, tokens, token_ok, stride_x_token, stride_x_head, cos, sin,
            NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr,
            HALF_PAD: tl.constexpr):
    """Rotate ``[TOKENS, NUM_HEADS, 2 * HALF]`` with ``cos``/``sin`` of ``[TOKENS, HALF_PAD]``
    and store it contiguously at ``out_ptr``."""
    heads = tl.arange(0, HEADS_PAD)[None, :, None]
    dims = tl.arange(0, HALF_PAD)[None, None, :]
    tok = tokens[:, None, None]
    mask = token_ok[:, None, None] & (heads < NUM_HEADS) & (dims < HALF)
    src = x_ptr + tok * stride_x_token + heads * stride_x_head + dims
    first = tl.load(src, mask=mask, other=0.0)
    second = tl.load(src + HALF, mask=mask, other=0.0)
    dtype = first.dtype
    c = cos[:, None, :].to(dtype).to(tl.float32)
    s = sin[:, None, :].to(dtype).to(tl.float32)
    f32, s32 = first.to(tl.float32), second.to(tl.float32)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-second, first)
    new_first = (f32 * c).to(dtype).to(tl.float32) + (-s32 * s).to(dtype).to(tl.float32)
    new_second = (s32 * c).to(dtype).to(tl.float32) + (f32 * s).to(dtype).to(tl.float32)
    dst = out_ptr + (tok * NUM_HEADS + heads) * (2 * HALF) + dims
    tl.store(dst, new_first.to(dtype), mask=mask)
    tl.store(dst + HALF, new_second.to(dtype), mask=mask)


@triton.jit
def rotary_kernel(
    q_out_ptr, k_out_ptr,  # contiguous [T, heads, head_dim] and [T, kv_heads, head_dim]
    q_ptr, k_ptr, positions_ptr, inv_freq_ptr,
    num_tokens, stride_q_token, stride_q_head, stride_k_token, stride_k_head,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TOKENS: tl.constexpr,
):
    tokens = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    token_ok = tokens < num_tokens
    dims = tl.arange(0, HALF_PAD)
    position = tl.load(positions_ptr + tokens, mask=token_ok, other=0).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + dims, mask=dims < HALF, other=0.0)
    angle = position[:, None] * inv_freq[None, :]
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    _rotate(q_ptr, q_out_ptr, tokens, token_ok, stride_q_token, stride_q_head, cos, sin,
            NUM_HEADS, HEADS_PAD, HALF, HALF_PAD)
    _rotate(k_ptr, k_out_ptr, tokens, token_ok, stride_k_token, stride_k_head, cos, sin,
            NUM_KV_HEADS, KV_HEADS_PAD, HALF, HALF_PAD)


def rotary_embedding(
    positions: torch.Tensor,  # int64 [T]
    query: torch.Tensor,  # [T, heads, head_dim]
    key: torch.Tensor,  # [T, kv_heads, head_dim]
    inv_freq: torch.Tensor,  # fp32 [head_dim / 2]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated query and key (new contiguous tensors)."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    half = head_dim // 2
    if head_dim % 2 or key.shape[2] != head_dim or inv_freq.shape != (half,):
        raise ValueError(f"rotary needs an even head_dim shared by q {tuple(query.shape)} and "
                         f"k {tuple(key.shape)} and inv_freq of head_dim / 2, got "
                         f"{tuple(inv_freq.shape)}")
    if query.stride(-1) != 1 or key.stride(-1) != 1:
        raise ValueError("the head dimension of query and key must be contiguous")
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    if num_tokens:
        heads_pad = triton.next_power_of_2(num_heads)
        half_pad = triton.next_power_of_2(half)
        per_program = active_tuning().rows_per_program(heads_pad * half_pad * 2)
        rotary_kernel[(triton.cdiv(num_tokens, per_program),)](
            q_out, k_out, query, key, positions, inv_freq,
            num_tokens, query.stride(0), query.stride(1), key.stride(0), key.stride(1),
            NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEADS_PAD=heads_pad,
            KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads), HALF=half, HALF_PAD=half_pad,
            TOKENS=per_program, num_warps=active_tuning().elementwise_warps,
        )
    return q_out, k_out
