"""Ragged paged attention for TPU as a Pallas kernel (design after tpu-inference's RPA v2).

One call serves a mixed batch: decodes, chunked prefills and full prefills, flattened into
one padded query array, each sequence's queries being the last tokens of its context.

Grid ``(kv head blocks, query blocks)``. A grid step holds ``num_queries_per_block`` query
rows of every q head of its KV heads (q is regrouped in the wrapper to
``[kv_heads, group, tokens, head_dim]`` so each head's rows are one 2-D tile and the group is
folded into the matmul's M dimension). For each sequence the query block touches, it walks the
sequence's pages from the first the sliding window still needs to the last the causal limit
allows, ``num_kv_pages_per_block`` pages at a time: pages stay in HBM and are copied one by one
with async DMAs into a double-buffered VMEM scratch (block ``b + 1``, or after a sequence's
last block the next sequence's first, is in flight while block ``b`` is computed), then folded
into an online softmax with f32 running max, sum and accumulator. Pages wholly before the
window of the block's first query or past the causal limit of its last are never copied.
Grid steps share no state (both grid axes are "parallel"); unlike RPA v2 the DMA of a step's
first block is not overlapped with the previous step. Block sizes default to the
per-generation table in ``block_sizes``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .block_sizes import default_block_sizes
from .interpret import interpret_params
from .kv_write import write_kv
from .reference import ref_ragged_paged_attention
from .validation import check_attention_inputs

__all__ = ["ragged_paged_attention", "ref_ragged_paged_attention", "write_kv"]

# Finite "minus infinity" for masked logits: exp(MASK - m) underflows to 0 for any real m,
# and a row that so far saw only masked keys never produces inf - inf.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@dataclass(frozen=True)
class _Geometry:
    """The static sizes a kernel instance is built for."""

    num_kv_heads_per_block: int
    group: int  # q heads per kv head
    queries_per_block: int
    pages_per_block: int
    page_size: int
    head_dim: int

    @property
    def combined_per_block(self) -> int:
        return 2 * self.num_kv_heads_per_block

    @property
    def rows(self) -> int:
        return self.group * self.queries_per_block

    @property
    def kv_per_block(self) -> int:
        return self.pages_per_block * self.page_size


@dataclass(frozen=True)
class _SeqPlan:
    """What one grid step does for one sequence: its rows ``[lo, hi)`` of the query block and
    the pages ``[page_lo, page_hi)`` of its page table those rows can see (traced scalars)."""

    seq: jax.Array
    seq_start: jax.Array  # its first query row
    ctx_start: jax.Array  # position of its first query
    lo: jax.Array
    hi: jax.Array
    kv_hi: jax.Array  # one past the last key position any of the rows sees
    page_lo: jax.Array
    page_hi: jax.Array
    num_blocks: jax.Array  # KV blocks covering [page_lo, page_hi)

    @property
    def has_work(self) -> jax.Array:
        return self.hi > self.lo


@dataclass(frozen=True)
class _Options:
    sm_scale: float
    sliding_window: int | None
    soft_cap: float | None


def _load_kv_head(kv_buf, head: int) -> tuple[jax.Array, jax.Array]:
    """K and V ``[kv_per_block, head_dim]`` of one kv head of the block's VMEM buffer
    ``[kv_per_block, combined_per_block, head_dim]`` (K at even, V at odd combined heads).
    Plain indexed loads: TPU interpret mode supports no ref reshape or bitcast, so RPA v2's
    flatten-and-stride (and its uint32 split of bf16 K/V pairs) cannot be tested there."""
    return kv_buf[:, 2 * head, :], kv_buf[:, 2 * head + 1, :]


def _attention_kernel(kv_lens_ref, page_indices_ref, cu_q_lens_ref, num_seqs_ref,
                      q_ref, kv_hbm_ref, o_ref, kv_bufs, sems, *,
                      geo: _Geometry, opts: _Options):
    """One (kv head block, query block) grid step; see the module docstring."""
    bq, ps, npb = geo.queries_per_block, geo.page_size, geo.pages_per_block
    max_num_seqs, pages_per_seq = page_indices_ref.shape
    head_blk, q_blk = pl.program_id(0), pl.program_id(1)
    blk_start = q_blk * bq
    blk_end = blk_start + bq
    num_seqs = num_seqs_ref[0]
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)  # rows of no sequence stay defined

    # Token index of each matmul row: rows are (q head in group, query) flattened.
    row_tok = blk_start + jnp.concatenate(
        [lax.broadcasted_iota(jnp.int32, (bq, 1), 0)] * geo.group, axis=0)
    q_heads = [jnp.concatenate([q_ref[j, g] for g in range(geo.group)], axis=0)
               for j in range(geo.num_kv_heads_per_block)]

    def next_cu(s):
        return cu_q_lens_ref[jnp.minimum(s + 1, max_num_seqs)]

    first_seq = lax.while_loop(
        lambda s: (s < num_seqs) & (next_cu(s) <= blk_start), lambda s: s + 1, jnp.int32(0))

    def seq_in_block(s):
        return (s < num_seqs) & (cu_q_lens_ref[jnp.minimum(s, max_num_seqs)] < blk_end)

    def plan(s) -> _SeqPlan:
        seq_start, seq_end = cu_q_lens_ref[s], cu_q_lens_ref[s + 1]
        ctx_start = kv_lens_ref[s] - (seq_end - seq_start)  # position of its first query
        lo, hi = jnp.maximum(seq_start, blk_start), jnp.minimum(seq_end, blk_end)
        kv_hi = ctx_start + (hi - seq_start)  # keys past the block's last query are never seen
        kv_lo = 0 if opts.sliding_window is None else jnp.maximum(
            0, ctx_start + (lo - seq_start) - opts.sliding_window + 1)
        # lax.div, not //: the operands are non-negative, and Python's floor semantics would
        # lower to sign ops that Mosaic lowering resolves per TPU generation.
        page_lo = lax.div(kv_lo, ps)
        page_hi = lax.div(kv_hi + ps - 1, ps)
        return _SeqPlan(s, seq_start, ctx_start, lo, hi, kv_hi, page_lo, page_hi,
                        lax.div(page_hi - page_lo + npb - 1, npb))

    def copies(p: _SeqPlan, blk, slot):
        """(needed, descriptor) for each page of KV block ``blk`` of ``p`` into ``slot``."""
        result = []
        for i in range(npb):
            page = p.page_lo + blk * npb + i
            page_id = page_indices_ref[p.seq, jnp.minimum(page, pages_per_seq - 1)]
            src = kv_hbm_ref.at[page_id, :, pl.ds(head_blk * geo.combined_per_block,
                                                  geo.combined_per_block), :]
            dst = kv_bufs.at[slot, pl.ds(i * ps, ps)]
            result.append((page < p.page_hi, pltpu.make_async_copy(src, dst, sems.at[slot])))
        return result

    def start(p: _SeqPlan, blk, slot):
        for needed, copy in copies(p, blk, slot):
            pl.when(needed)(copy.start)

    def wait(p: _SeqPlan, blk, slot):
        for needed, copy in copies(p, blk, slot):
            pl.when(needed)(copy.wait)

    def attend_seq(state):
        """Sequence ``s``'s rows of this block; its first KV block is already in flight when
        ``prefetched`` (started by the previous sequence's last block)."""
        s, first_slot, prefetched = state
        p = plan(s)
        nxt = plan(jnp.minimum(s + 1, max_num_seqs - 1))
        nxt_has_work = seq_in_block(s + 1) & nxt.has_work
        row_pos = p.ctx_start + (row_tok - p.seq_start)  # [rows, 1]
        row_ok = (row_tok >= p.lo) & (row_tok < p.hi)

        def kv_step(blk, carry):
            slot = lax.rem(first_slot + blk, 2)
            last = blk + 1 == p.num_blocks
            pl.when(jnp.logical_not(last))(lambda: start(p, blk + 1, 1 - slot))
            pl.when(last & nxt_has_work)(lambda: start(nxt, 0, 1 - slot))
            wait(p, blk, slot)
            first_pos = (p.page_lo + blk * npb) * ps
            col_pos = first_pos + lax.broadcasted_iota(jnp.int32, (1, geo.kv_per_block), 1)
            # Rows at or past kv_hi were never copied (their pages may be skipped): garbage.
            v_ok = (first_pos + lax.broadcasted_iota(jnp.int32, (geo.kv_per_block, 1), 0)
                    < p.kv_hi)
            allowed = (col_pos <= row_pos) & row_ok
            if opts.sliding_window is not None:
                allowed &= col_pos > row_pos - opts.sliding_window
            new_carry = []
            for j, (m_prev, l_prev, acc_prev) in enumerate(carry):
                k, v = _load_kv_head(kv_bufs.at[slot], j)
                v = jnp.where(v_ok, v, jnp.zeros_like(v))  # 0 * NaN would poison p @ v
                logits = lax.dot_general(q_heads[j], k, (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32) * opts.sm_scale
                if opts.soft_cap is not None:
                    logits = opts.soft_cap * jnp.tanh(logits / opts.soft_cap)
                logits = jnp.where(allowed, logits, MASK_VALUE)
                m_next = jnp.maximum(m_prev, jnp.max(logits, axis=1, keepdims=True))
                probs = jnp.where(allowed, jnp.exp(logits - m_next), 0.0)
                alpha = jnp.exp(m_prev - m_next)
                l_next = alpha * l_prev + jnp.sum(probs, axis=1, keepdims=True)
                pv = jnp.dot(probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
                new_carry.append((m_next, l_next, alpha * acc_prev + pv))
            return tuple(new_carry)

        @pl.when(p.has_work)
        def _attend():
            pl.when(jnp.logical_not(prefetched))(lambda: start(p, 0, first_slot))
            init = tuple((jnp.full((geo.rows, 1), -jnp.inf, jnp.float32),
                          jnp.zeros((geo.rows, 1), jnp.float32),
                          jnp.zeros((geo.rows, geo.head_dim), jnp.float32))
                         for _ in range(geo.num_kv_heads_per_block))
            final = lax.fori_loop(0, p.num_blocks, kv_step, init)
            for j, (_, l_sum, acc) in enumerate(final):
                out = acc / jnp.where(l_sum == 0.0, 1.0, l_sum)
                for g in range(geo.group):
                    rows = slice(g * bq, (g + 1) * bq)
                    o_ref[j, g] = jnp.where(row_ok[rows], out[rows].astype(o_ref.dtype),
                                            o_ref[j, g])

        next_slot = jnp.where(p.has_work, lax.rem(first_slot + p.num_blocks, 2), first_slot)
        return s + 1, next_slot, p.has_work & nxt_has_work

    lax.while_loop(lambda state: seq_in_block(state[0]), attend_seq,
                   (first_seq, jnp.int32(0), jnp.bool_(False)))


def _sublane_tile(dtype) -> int:
    """Rows of one TPU vreg tile of this dtype: 8 of 32-bit values, 16 of bf16."""
    return 8 * (4 // jnp.dtype(dtype).itemsize)


def _kv_heads_per_block(num_kv_heads: int, dtype) -> int:
    """KV heads per grid step: enough that the combined (K+V) heads fill a sublane tile
    when the head count allows, else all of them."""
    tile = _sublane_tile(dtype)
    return tile // 2 if (2 * num_kv_heads) % tile == 0 else num_kv_heads


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "num_kv_pages_per_block",
    "num_queries_per_block", "interpret"))
def ragged_paged_attention(
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
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """Attention of every query row of a mixed prefill/decode batch over its paged context.

    q ``[T, num_q_heads, head_dim]``; kv_cache ``[num_pages, page_size, 2 * num_kv_heads,
    head_dim]`` (K heads at even, V heads at odd indices); kv_lens int32 ``[max_num_seqs]``
    (context length including this step's tokens); page_indices int32 ``[max_num_seqs,
    pages_per_seq]``; cu_q_lens int32 ``[max_num_seqs + 1]``; num_seqs int32 ``[1]``.
    Returns ``[T, num_q_heads, head_dim]`` in q's dtype; rows past ``cu_q_lens[num_seqs]``
    are zero. Query head h reads kv head ``h // (num_q_heads // num_kv_heads)``; a query at
    position p sees keys at positions ``<= p`` and, with a window w, ``> p - w``."""
    check_attention_inputs(q, kv_cache, kv_lens, page_indices, cu_q_lens, num_seqs,
                           sliding_window=sliding_window, soft_cap=soft_cap)
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, combined, _ = kv_cache.shape
    num_kv_heads = combined // 2
    group = num_q_heads // num_kv_heads
    pages_per_seq = page_indices.shape[1]
    tile = _sublane_tile(q.dtype)  # a query block is whole (tile, 128) tiles of q's dtype
    default_pages, default_queries = default_block_sizes(page_size, pages_per_seq, num_tokens,
                                                         tile)
    pages = num_kv_pages_per_block or default_pages
    bq = num_queries_per_block or default_queries
    if not 0 < pages <= pages_per_seq:
        raise ValueError(f"num_kv_pages_per_block must be in [1, {pages_per_seq}], got {pages}")
    if bq <= 0 or bq % tile:
        raise ValueError(f"num_queries_per_block must be a positive multiple of {tile} for "
                         f"{jnp.dtype(q.dtype).name} queries, got {bq}")
    geo = _Geometry(_kv_heads_per_block(num_kv_heads, kv_cache.dtype), group, bq, pages,
                    page_size, head_dim)
    padded = -(-num_tokens // bq) * bq
    # [T, Hq, hd] -> [H, G, T_pad, hd]: each q head's rows form one 2-D tile.
    q4 = q.reshape(num_tokens, num_kv_heads, group, head_dim).transpose(1, 2, 0, 3)
    q4 = jnp.pad(q4, ((0, 0), (0, 0), (0, padded - num_tokens), (0, 0)))
    q_spec = pl.BlockSpec((geo.num_kv_heads_per_block, group, bq, head_dim),
                          lambda h, i, *_: (h, 0, i, 0))
    kernel = pl.pallas_call(
        functools.partial(_attention_kernel, geo=geo,
                          opts=_Options(sm_scale, sliding_window, soft_cap)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(num_kv_heads // geo.num_kv_heads_per_block, padded // bq),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, geo.kv_per_block, geo.combined_per_block, head_dim),
                           kv_cache.dtype),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
        interpret=interpret_params(interpret),
        name="octavo_ragged_paged_attention",
    )
    out4 = kernel(kv_lens, page_indices, cu_q_lens, num_seqs, q4, kv_cache)
    return out4[:, :, :num_tokens].transpose(2, 0, 1, 3).reshape(num_tokens, num_q_heads,
                                                                 head_dim)
