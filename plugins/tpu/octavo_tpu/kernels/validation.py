"""Shape, dtype and option checks shared by the kernels and the reference: trace-time only
(the dynamic contents - lengths, page ids, slots - are the caller's contract)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_attention_inputs(
    q: jax.Array,
    kv_cache: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    sliding_window: int | None,
    soft_cap: float | None,
) -> None:
    """Raise ValueError naming the first argument whose shape, dtype or value is wrong."""
    if q.ndim != 3:
        raise ValueError(f"q must be [num_tokens, num_q_heads, head_dim], got shape {q.shape}")
    if kv_cache.ndim != 4 or kv_cache.shape[2] % 2:
        raise ValueError("kv_cache must be [num_pages, page_size, 2 * num_kv_heads, head_dim], "
                         f"got shape {kv_cache.shape}")
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[2] // 2
    if kv_cache.shape[3] != head_dim:
        raise ValueError(f"kv_cache head_dim {kv_cache.shape[3]} != q head_dim {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads "
                         f"{num_kv_heads}")
    if page_indices.ndim != 2:
        raise ValueError(f"page_indices must be [max_num_seqs, pages_per_seq], got shape "
                         f"{page_indices.shape}")
    max_num_seqs = page_indices.shape[0]
    expected = {"kv_lens": (max_num_seqs,), "cu_q_lens": (max_num_seqs + 1,), "num_seqs": (1,)}
    for name, array in (("kv_lens", kv_lens), ("page_indices", page_indices),
                        ("cu_q_lens", cu_q_lens), ("num_seqs", num_seqs)):
        if array.dtype != jnp.int32:
            raise ValueError(f"{name} must be int32, got {array.dtype}")
        if name in expected and array.shape != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {array.shape}")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive, got {sliding_window}")
    if soft_cap is not None and soft_cap <= 0:
        raise ValueError(f"soft_cap must be positive, got {soft_cap}")


def check_write_inputs(kv_cache: jax.Array, k: jax.Array, v: jax.Array,
                       slot_mapping: jax.Array, num_tokens: jax.Array) -> None:
    """Raise ValueError naming the first argument of ``write_kv`` that does not fit."""
    if kv_cache.ndim != 4 or kv_cache.shape[2] % 2:
        raise ValueError("kv_cache must be [num_pages, page_size, 2 * num_kv_heads, head_dim], "
                         f"got shape {kv_cache.shape}")
    want = (slot_mapping.shape[0] if slot_mapping.ndim == 1 else -1,
            kv_cache.shape[2] // 2, kv_cache.shape[3])
    for name, array in (("k", k), ("v", v)):
        if array.shape != want:
            raise ValueError(f"{name} must be [num_tokens, num_kv_heads, head_dim] = {want}, "
                             f"got {array.shape}")
    if slot_mapping.ndim != 1 or slot_mapping.dtype != jnp.int32:
        raise ValueError(f"slot_mapping must be int32 [T], got {slot_mapping.dtype} "
                         f"{slot_mapping.shape}")
    if num_tokens.shape != (1,) or num_tokens.dtype != jnp.int32:
        raise ValueError(f"num_tokens must be int32 [1], got {num_tokens.dtype} "
                         f"{num_tokens.shape}")
