"""Paged attention over the KV cache: decode (one query token per request) and prefill with
cached context (a request's new tokens attend causally to its cached and new K/V), with
grouped-query heads and an optional sliding window, as flash attention: an online softmax
with fp32 running max and sum.

Per request, query head and tile of up to 128 query tokens, the context is walked 128
positions at a time. A K/V tile is gathered by slot (block table entry * block size +
offset, computed on chip from the block table), transposed on the Tensor Engine so the
head dimension is the contraction (partition) axis of ``scores = q @ k^T``, and
``p @ v`` contracts over the 128 positions. The request layout (query starts, sequence
lengths) is taken from the host copies as compile-time constants; the block table is data.
The new tokens' K/V must already be in the cache (``write_kv`` first).
"""

from __future__ import annotations

import torch

from octavo_neuron.nki import nisa, nki, nl

from ._torch import PMAX, as_torch

MASKED = -1.0e30  # a finite -inf: exp(MASKED - max) is 0 and no inf - inf makes a NaN


@nki.jit
def paged_attention_kernel(query, kv_cache, block_tables, query_starts, seq_lens, scale,
                           sliding_window):
    """``query`` [T, H, D], ``kv_cache`` [2, blocks, block_size, KVH, D], ``block_tables``
    [R, W] int32; ``query_starts`` (R + 1 ints), ``seq_lens`` (R ints), ``sliding_window``
    (keys visible per query; 0: all) -> [T, H, D]."""
    num_tokens, num_heads, head_dim = query.shape
    _, num_blocks, block_size, kv_heads, _ = kv_cache.shape
    out = nl.ndarray((num_tokens, num_heads, head_dim), dtype=query.dtype,
                     buffer=nl.shared_hbm)
    cache = kv_cache.reshape((2, num_blocks * block_size, kv_heads * head_dim))
    group = num_heads // kv_heads
    for req in nl.sequential_range(len(seq_lens)):
        start, end = query_starts[req], query_starts[req + 1]
        cached = seq_lens[req] - (end - start)
        for q0 in nl.sequential_range(start, end, PMAX):
            for head in nl.affine_range(num_heads):
                _attend(query, cache, block_tables, out, req, q0, min(PMAX, end - q0),
                        cached + q0 - start, head, head // group, block_size, scale,
                        sliding_window)
    return out


def _attend(query, cache, block_tables, out, req, q0, tq, first_pos, head, kv_head,
            block_size, scale, window) -> None:
    """Query tokens ``q0..q0+tq`` (positions ``first_pos..``) of one head against the
    context positions they can see (all before them, or the last ``window``).

    A row can meet a tile in which it sees nothing (before its window); its garbage
    (``exp(0)`` terms) is wiped by the correction ``exp(MASKED - max)`` = 0 of the tile
    holding its own position, which every row sees."""
    head_dim = query.shape[2]
    i_d = nl.arange(head_dim)[:, None]
    i_qf = nl.arange(tq)[None, :]
    i_qp = nl.arange(tq)[:, None]
    i_f = nl.arange(head_dim)[None, :]
    q_t = nl.load(query[q0 + i_qf, head, i_d])  # [D, tq]: head dim on partitions
    running_max = nl.full((tq, 1), MASKED, dtype=nl.float32)
    running_sum = nl.zeros((tq, 1), dtype=nl.float32)
    acc = nl.zeros((tq, head_dim), dtype=nl.float32)
    context = first_pos + tq
    lowest = max(0, first_pos - window + 1) if window else 0
    for k0 in nl.sequential_range(lowest // PMAX * PMAX, context, PMAX):
        tk = min(PMAX, context - k0)
        pos = k0 + nl.arange(tk)[:, None]
        block = nl.load(block_tables[req + 0 * pos, pos // block_size])  # [tk, 1]
        slots = nl.add(nl.multiply(block, block_size), nisa.iota(pos % block_size, nl.int32))
        k = nl.load(cache[0, slots, kv_head * head_dim + i_f])  # [tk, D]
        v = nl.load(cache[1, slots, kv_head * head_dim + i_f])
        k_t = nl.copy(nisa.nc_transpose(k), dtype=k.dtype)  # [D, tk]
        scores = nl.multiply(nisa.nc_matmul(q_t, k_t), scale)  # [tq, tk] fp32
        key_pos = k0 + nl.arange(tk)[None, :]
        visible = key_pos <= first_pos + i_qp
        if window:
            visible = visible & (key_pos > first_pos + i_qp - window)
        scores = nl.where(visible, scores, MASKED)
        new_max = nl.maximum(running_max, nl.max(scores, axis=1, keepdims=True))
        probs = nl.exp(nl.subtract(scores, new_max))
        correction = nl.exp(nl.subtract(running_max, new_max))
        running_sum = nl.add(nl.multiply(running_sum, correction),
                             nl.sum(probs, axis=1, keepdims=True))
        probs_t = nl.copy(nisa.nc_transpose(probs), dtype=v.dtype)  # [tk, tq]
        acc = nl.add(nl.multiply(acc, correction), nisa.nc_matmul(probs_t, v))
        running_max = new_max
    nl.store(out[q0 + i_qp, head, i_f], nl.divide(acc, running_sum, dtype=query.dtype))


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    sliding_window: int | None = None) -> torch.Tensor:
    """Attention of ``query`` [T, H, D] (``num_actual_tokens`` rows) over ``kv_cache``
    [2, blocks, block_size, KVH, D]; ``query_start_loc``/``seq_lens`` are read on the host
    (pass the metadata's ``_cpu`` copies); returns one row per actual query token."""
    starts = tuple(int(s) for s in query_start_loc.tolist())
    lens = tuple(int(s) for s in seq_lens.tolist())
    out = paged_attention_kernel(query[:starts[-1]], kv_cache, block_tables.to(torch.int32),
                                 starts, lens, scale, sliding_window or 0)
    return as_torch(out, query)
