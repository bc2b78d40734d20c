"""Paged attention over the mixed batch of the ``AttentionBackend`` contract.

One kernel serves prompt chunks and decodes alike. The flattened query of the step is cut
into *query blocks*: each request's query tokens in tiles of ``BLOCK_Q`` tokens, so that a
program never mixes two requests. A program takes one query block and one kv head, and
holds the ``BLOCK_Q`` tokens times the ``GROUP`` query heads that share that kv head as the
``BLOCK_M`` rows of one tile (grouped-query attention costs no extra K/V reads). It walks
the request's cache blocks through its block table, one cache block (``BLOCK_SIZE`` keys)
per iteration, with an online softmax: causal masking puts query token ``j`` of a request
with ``q`` new tokens and ``s`` tokens of context at position ``s - q + j``, which is what
lets a chunk attend to the prefix already in the cache.

Request ``i``'s query blocks are numbered from ``query_start_loc[i] // BLOCK_Q + i``, so
the grid needs no host-side list of blocks (``T // BLOCK_Q + num_reqs`` programs cover any
layout) and a program finds its request by binary search. Grid sizes depend only on the
token and request counts, which is what CUDA graphs need.

Split-KV: when every request decodes one token and there are few of them, the context of
each request is cut into ``NUM_SEGMENTS`` parts handled by separate programs, which write
unnormalised partial results; :func:`combine_segments_kernel` merges them. Segment bounds
are computed in the kernel from the sequence lengths, so a captured graph stays valid as
sequences grow.

The cache may be fp8: keys and values are then multiplied by their scale after loading.
A request with no context (``seq_len`` 0: a padding row of a CUDA-graph batch) gets zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugin_api import AttentionMetadata
from octavo_triton.tuning import KernelTuning, active_tuning

LOG2E = 1.4426950408889634


@triton.jit
def _find_request(query_start_loc_ptr, num_reqs, query_block, BLOCK_Q: tl.constexpr):
    """The last request whose first query block is at or before ``query_block``."""
    low = 0
    high = num_reqs
    while low < high:
        mid = (low + high) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= query_block:
            low = mid + 1
        else:
            high = mid
    return low - 1


@triton.jit
def _attend_blocks(
    q, rows_pos, acc, row_max, row_sum,
    k_cache_ptr, v_cache_ptr, block_table_ptr,
    first_block, end_block, seq_len, kv_head, sm_scale, k_scale, v_scale,
    stride_cache_block, stride_cache_token, stride_cache_head,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr, SCALED: tl.constexpr,
):
    """Online softmax of the query tile ``q`` [BLOCK_M, DIM_PAD] over cache blocks
    ``first_block:end_block`` of one request; ``rows_pos`` is each row's position in its
    sequence. Scores are kept in base 2 (``sm_scale`` includes log2(e))."""
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    tokens = tl.arange(0, BLOCK_SIZE)
    for logical in range(first_block, end_block):
        physical = tl.load(block_table_ptr + logical).to(tl.int64)
        key_pos = logical * BLOCK_SIZE + tokens
        key_ok = key_pos < seq_len
        base = physical * stride_cache_block + kv_head * stride_cache_head
        k = tl.load(k_cache_ptr + base + tokens[None, :] * stride_cache_token + dims[:, None],
                    mask=dim_ok[:, None] & key_ok[None, :], other=0.0)  # [DIM_PAD, BLOCK_SIZE]
        v = tl.load(v_cache_ptr + base + tokens[:, None] * stride_cache_token + dims[None, :],
                    mask=key_ok[:, None] & dim_ok[None, :], other=0.0)  # [BLOCK_SIZE, DIM_PAD]
        if SCALED:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        scores = tl.dot(q, k, input_precision="ieee") * sm_scale  # [BLOCK_M, BLOCK_SIZE]
        allowed = (key_pos[None, :] <= rows_pos[:, None]) & key_ok[None, :]
        if SLIDING_WINDOW > 0:
            allowed = allowed & (key_pos[None, :] > rows_pos[:, None] - SLIDING_WINDOW)
        scores = tl.where(allowed, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        # Rows that have seen no allowed key yet keep a max of -inf; shift them by 0.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp2(scores - shift[:, None])
        rescale = tl.exp2(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def paged_attention_kernel(
    out_ptr,  # NUM_SEGMENTS == 1: [T, num_heads, head_dim]; else fp32 [SEG, T, heads, DIM_PAD]
    seg_max_ptr, seg_sum_ptr,  # fp32 [SEG, T, num_heads] (split-KV only)
    q_ptr,  # [T, num_heads, head_dim]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, kv_heads, head_dim]
    block_tables_ptr,  # int32 [num_reqs, max_blocks]
    seq_lens_ptr,  # int32 [num_reqs]
    query_start_loc_ptr,  # int32 [num_reqs + 1]
    num_reqs, num_tokens,
    sm_scale, k_scale, v_scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_token, stride_cache_head, stride_block_table,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_M: tl.constexpr,  # tile rows: BLOCK_Q tokens x GROUP heads (padded)
    BLOCK_Q: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,  # 0: none
    SCALED: tl.constexpr,  # fp8 cache: multiply by k_scale / v_scale
    NUM_SEGMENTS: tl.constexpr,  # > 1: split-KV, write partial results
):
    query_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    req = _find_request(query_start_loc_ptr, num_reqs, query_block, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    block_in_req = query_block - (q_start // BLOCK_Q + req)
    if block_in_req * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, DIM_PAD)
    q_index = block_in_req * BLOCK_Q + rows // GROUP  # query token within the request
    heads = kv_head * GROUP + rows % GROUP
    row_ok = (rows // GROUP < BLOCK_Q) & (q_index < q_len)
    tokens = q_start + q_index
    q_mask = row_ok[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + tokens[:, None] * stride_q_token + heads[:, None] * stride_q_head
                + dims[None, :], mask=q_mask, other=0.0)
    rows_pos = context_len + q_index

    # Cache blocks this tile needs: up to its last query token, from the first key inside
    # the sliding window of its first query token.
    last_pos = context_len + tl.minimum((block_in_req + 1) * BLOCK_Q, q_len) - 1
    end_block = last_pos // BLOCK_SIZE + 1
    first_block = 0
    if SLIDING_WINDOW > 0:
        first_key = tl.maximum(context_len + block_in_req * BLOCK_Q - SLIDING_WINDOW + 1, 0)
        first_block = first_key // BLOCK_SIZE
    if NUM_SEGMENTS > 1:
        per_segment = tl.cdiv(end_block - first_block, NUM_SEGMENTS)
        first_block = first_block + segment * per_segment
        end_block = tl.minimum(end_block, first_block + per_segment)

    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, row_max, row_sum = _attend_blocks(
        q, rows_pos, acc, row_max, row_sum, k_cache_ptr, v_cache_ptr,
        block_tables_ptr + req.to(tl.int64) * stride_block_table,
        first_block, end_block, seq_len, kv_head, sm_scale, k_scale, v_scale,
        stride_cache_block, stride_cache_token, stride_cache_head,
        HEAD_DIM, DIM_PAD, BLOCK_SIZE, SLIDING_WINDOW, SCALED)

    if NUM_SEGMENTS == 1:
        out = acc / tl.where(row_sum == 0.0, 1.0, row_sum)[:, None]
        tl.store(out_ptr + tokens[:, None] * stride_out_token + heads[:, None] * stride_out_head
                 + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        token_head = (segment * num_tokens + tokens) * NUM_HEADS + heads
        tl.store(out_ptr + token_head[:, None] * DIM_PAD + dims[None, :], acc,
                 mask=row_ok[:, None])
        tl.store(seg_max_ptr + token_head, row_max, mask=row_ok)
        tl.store(seg_sum_ptr + token_head, row_sum, mask=row_ok)


@triton.jit
def combine_segments_kernel(
    out_ptr,  # [T, num_heads, head_dim]
    seg_acc_ptr,  # fp32 [SEG, T, num_heads, DIM_PAD]
    seg_max_ptr, seg_sum_ptr,  # fp32 [SEG, T, num_heads]
    num_tokens, stride_out_token, stride_out_head,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    """Merge the partial softmax results of one (token, head) over the segments."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    segments = tl.arange(0, NUM_SEGMENTS)
    dims = tl.arange(0, DIM_PAD)
    token_head = (segments * num_tokens + token) * NUM_HEADS + head
    seg_max = tl.load(seg_max_ptr + token_head)
    seg_sum = tl.load(seg_sum_ptr + token_head)
    overall = tl.max(seg_max, 0)
    shift = tl.where(overall == float("-inf"), 0.0, overall)
    weight = tl.exp2(seg_max - shift)  # 0 for empty segments (max -inf)
    total = tl.sum(seg_sum * weight, 0)
    acc = tl.load(seg_acc_ptr + token_head[:, None] * DIM_PAD + dims[None, :])
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + token * stride_out_token + head * stride_out_head + dims,
             out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def split_kv_segments(metadata: AttentionMetadata, num_kv_heads: int,
                      tuning: KernelTuning) -> int:
    """Parts each request's context is split into: 1 (no split) unless the step is decodes
    only, too few to give every compute unit a (request, kv head) program, and long."""
    if (metadata.max_query_len == 1
            and metadata.num_reqs * num_kv_heads < tuning.split_kv_max_programs
            and metadata.max_seq_len >= tuning.split_kv_min_seq_len):
        return tuning.split_kv_segments
    return 1


def paged_attention(
    out: torch.Tensor,  # [T, num_heads, head_dim], written for the first num_actual_tokens
    query: torch.Tensor,  # [T, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Attention of every query token of the step over its request's paged context (the
    step's own keys and values must already be in the cache)."""
    num_tokens = metadata.num_actual_tokens
    num_reqs = metadata.num_reqs
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    if num_tokens == 0:
        return
    if query.stride(-1) != 1 or out.stride(-1) != 1 or key_cache.stride(-1) != 1:
        raise ValueError("the head dimension of query, output and cache must be contiguous")
    tuning = active_tuning()
    group = num_heads // num_kv_heads
    decode_only = metadata.max_query_len == 1
    dim_pad = max(triton.next_power_of_2(head_dim), 16)
    block_m = tuning.attention_block_m(decode_only, group, dim_pad)
    block_q = block_m // group
    num_query_blocks = num_tokens // block_q + num_reqs
    segments = split_kv_segments(metadata, num_kv_heads, tuning)
    if segments == 1:
        target, seg_max, seg_sum = out, out, out  # the statistics pointers go unused
    else:
        target = torch.empty(segments, num_tokens, num_heads, dim_pad, dtype=torch.float32,
                             device=query.device)
        seg_max = torch.empty(segments, num_tokens, num_heads, dtype=torch.float32,
                              device=query.device)
        seg_sum = torch.empty_like(seg_max)
    paged_attention_kernel[(num_query_blocks, num_kv_heads, segments)](
        target, seg_max, seg_sum, query, key_cache, value_cache,
        metadata.block_tables, metadata.seq_lens, metadata.query_start_loc,
        num_reqs, num_tokens, scale * LOG2E, float(k_scale), float(v_scale),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        metadata.block_tables.stride(0),
        NUM_HEADS=num_heads, GROUP=group, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
        BLOCK_SIZE=key_cache.shape[1], BLOCK_M=block_m, BLOCK_Q=block_q,
        SLIDING_WINDOW=sliding_window or 0, SCALED=key_cache.dtype.itemsize == 1,
        NUM_SEGMENTS=segments, **tuning.attention_launch(),
    )
    if segments > 1:
        combine_segments_kernel[(num_tokens, num_heads)](
            out, target, seg_max, seg_sum, num_tokens, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, DIM_PAD=dim_pad, NUM_SEGMENTS=segments,
            num_warps=tuning.elementwise_warps,
        )
