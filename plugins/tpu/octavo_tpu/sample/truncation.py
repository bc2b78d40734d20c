"""Truncation of the distribution in JAX: min-p, top-k and top-p on temperature-scaled
logits [R, V], each row with its own setting (the core's octavo.sample.topk_topp, in
fixed shapes).

A dropped token's logit becomes -inf. Top-k and top-p come from one ascending sort of each
row and end as a per-row cutoff value (keep the logits at or above it) rather than a
scatter back through the sort order, which TPUs do slowly. The one difference from the
core's sort-and-mask: tokens tied exactly with the cutoff are all kept, where the core's
sort keeps some of them in whatever order its sort left them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def apply_min_p(logits: jax.Array, min_p: jax.Array) -> jax.Array:
    """Drop tokens less likely than ``min_p`` times the row's most likely token (min_p 0
    drops nothing)."""
    probs = jax.nn.softmax(logits, axis=-1)
    threshold = min_p[:, None] * probs.max(axis=-1, keepdims=True)
    return jnp.where(probs < threshold, -jnp.inf, logits)


def apply_top_k_top_p(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Keep the ``top_k`` largest logits (ties with the k-th kept), then the smallest set
    of the largest that holds ``top_p`` of the remaining mass. The sort runs only when
    some row truncates."""
    vocab_size = logits.shape[1]
    k = jnp.where((top_k <= 0) | (top_k > vocab_size), vocab_size, top_k)
    truncates = jnp.any(k < vocab_size) | jnp.any(top_p < 1)
    return jax.lax.cond(truncates, _truncate, lambda x, *_: x, logits, k, top_p)


def _truncate(logits: jax.Array, k: jax.Array, top_p: jax.Array) -> jax.Array:
    ascending = jnp.sort(logits, axis=-1)
    vocab_size = logits.shape[1]
    kth = jnp.take_along_axis(ascending, (vocab_size - k)[:, None], axis=1)
    ascending = jnp.where(ascending < kth, -jnp.inf, ascending)
    # Ascending cumulative probability: the head whose mass is at most 1 - p goes; the
    # most likely token always stays. The head is a prefix, so what stays starts at the
    # first position past it.
    cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
    drop = (cumulative <= 1 - top_p[:, None]).at[:, -1].set(False)
    first_kept = jnp.argmin(drop, axis=-1)  # the first False
    cutoff = jnp.take_along_axis(ascending, first_kept[:, None], axis=1)
    return jnp.where(logits < cutoff, -jnp.inf, logits)
