"""Dense jnp reference of ragged paged attention: the oracle of the kernel tests, and a
jit-able (slow, memory-hungry: it materialises every token's whole context) stand-in."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .validation import check_attention_inputs


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "num_kv_pages_per_block",
    "num_queries_per_block", "interpret"))
def ref_ragged_paged_attention(
    q: jax.Array,
    kv_cache: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    interpret: object = False,
) -> jax.Array:
    """Same contract as ``ragged_paged_attention`` (block sizes and ``interpret`` are accepted
    and ignored); computed in f32, rows past ``cu_q_lens[num_seqs]`` are zero."""
    del num_kv_pages_per_block, num_queries_per_block, interpret
    check_attention_inputs(q, kv_cache, kv_lens, page_indices, cu_q_lens, num_seqs,
                           sliding_window=sliding_window, soft_cap=soft_cap)
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, combined, _ = kv_cache.shape
    num_kv_heads = combined // 2
    group = num_q_heads // num_kv_heads
    max_num_seqs, pages_per_seq = page_indices.shape

    tokens = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], tokens, side="right"), 0, max_num_seqs - 1)
    valid = tokens < cu_q_lens[num_seqs[0]]
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    pos = kv_lens[seq] - q_len + (tokens - cu_q_lens[seq])  # [T]

    # [S, L, 2H, hd] contexts in page-table order, then each token's own: [T, L, H, hd].
    context_len = pages_per_seq * page_size
    ctx = kv_cache[page_indices].reshape(max_num_seqs, context_len, combined, head_dim)
    k = ctx[seq][:, :, 0::2].astype(jnp.float32)
    v = ctx[seq][:, :, 1::2].astype(jnp.float32)
    qf = q.astype(jnp.float32).reshape(num_tokens, num_kv_heads, group, head_dim)
    logits = jnp.einsum("thgd,tlhd->thgl", qf, k) * sm_scale
    if soft_cap is not None:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    key_pos = jnp.arange(context_len, dtype=jnp.int32)[None, :]
    allowed = key_pos <= pos[:, None]
    if sliding_window is not None:
        allowed &= key_pos > pos[:, None] - sliding_window
    allowed &= valid[:, None]
    logits = jnp.where(allowed[:, None, None, :], logits, -jnp.inf)
    probs = jax.nn.softmax(jnp.where(valid[:, None, None, None], logits, 0.0), axis=-1)
    out = jnp.einsum("thgl,tlhd->thgd", probs, v).reshape(num_tokens, num_q_heads, head_dim)
    return jnp.where(valid[:, None, None], out, 0.0).astype(q.dtype)
