"""Writing a step's new keys and values into the paged KV cache through ``slot_mapping``.

Slot ``s`` is block ``s // block_size``, offset ``s % block_size`` (the layout of
``octavo.attention.base``). A negative slot marks a padding token (CUDA-graph batches
are padded to a captured size) and is skipped, so padding never touches the cache.
A program writes ``TOKENS`` tokens, all their heads.

With an fp8 cache each value is divided by the layer's scale before the cast, so that
values larger than fp8's range still fit; the attention kernel multiplies it back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo_triton.tuning import active_tuning


@triton.jit
def reshape_and_cache_kernel(
    key_ptr, value_ptr,  # [T, kv_heads, head_dim], last dimension contiguous
    key_cache_ptr, value_cache_ptr,  # [num_blocks, block_size, kv_heads, head_dim]
    slot_mapping_ptr,  # int64 [T]
    k_scale, v_scale,  # fp32: cache value = value / scale (1.0 unless the cache is fp8)
    num_tokens,
    stride_key_token, stride_key_head, stride_value_token, stride_value_head,
    stride_cache_block, stride_cache_token, stride_cache_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HEADS_PAD: tl.constexpr,  # next powers of two of NUM_KV_HEADS and HEAD_DIM
    DIM_PAD: tl.constexpr,
    TOKENS: tl.constexpr,  # tokens per program
    SCALED: tl.constexpr,  # divide by the scales (fp8 cache)
):
    tokens = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1)
    tok = tokens[:, None, None]
    heads = tl.arange(0, HEADS_PAD)[None, :, None]
    dims = tl.arange(0, DIM_PAD)[None, None, :]
    mask = (slots[:, None, None] >= 0) & (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    key = tl.load(key_ptr + tok * stride_key_token + heads * stride_key_head + dims,
                  mask=mask)
    value = tl.load(value_ptr + tok * stride_value_token + heads * stride_value_head + dims,
                    mask=mask)
    if SCALED:
        key = key.to(tl.float32) / k_scale
        value = value.to(tl.float32) / v_scale
    slot = tl.maximum(slots, 0)[:, None, None]  # skipped tokens still need an address
    dst = ((slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_token
           + heads * stride_cache_head + dims)
    tl.store(key_cache_ptr + dst, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + dst, value.to(value_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,  # [T, kv_heads, head_dim]
    value: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # int64 [T]; negative = padding, skipped
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store each token's key/value at its slot; the cache dtype may be fp8 (then the
    values are divided by ``k_scale``/``v_scale`` first)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ in shape")
    if key.stride(-1) != 1 or value.stride(-1) != 1 or key_cache.stride(-1) != 1:
        raise ValueError("the head dimension of key/value and of the cache must be contiguous")
    if key_cache.shape[2:] != (num_kv_heads, head_dim):
        raise ValueError(f"cache {tuple(key_cache.shape)} does not hold {num_kv_heads} kv heads "
                         f"of {head_dim}")
    if num_tokens == 0:
        return
    heads_pad = triton.next_power_of_2(num_kv_heads)
    dim_pad = triton.next_power_of_2(head_dim)
    per_program = active_tuning().rows_per_program(heads_pad * dim_pad)
    reshape_and_cache_kernel[(triton.cdiv(num_tokens, per_program),)](
        key, value, key_cache, value_cache, slot_mapping, float(k_scale), float(v_scale),
        num_tokens, key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=key_cache.shape[1],
        HEADS_PAD=heads_pad, DIM_PAD=dim_pad, TOKENS=per_program,
        SCALED=key_cache.dtype.itemsize == 1, num_warps=active_tuning().elementwise_warps,
    )
