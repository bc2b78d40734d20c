"""One attention step in a paged KV cache, built from a seed, and the dense reference it must
match.

A step is a batch of requests, each with a cached prefix already in the cache and some new
tokens (a whole prompt, a chunk over a cached prefix, or one decode token), flattened as the
model runner flattens them (``AttentionMetadata``). Blocks no request owns hold noise that a
backend must never read. The reference recomputes each request's attention from its full,
unpaged K/V in fp64 - softmax(QK^T)V, query ``j`` of ``q`` new tokens at position
``s - q + j`` of ``s``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from octavo.plugin_api import AttentionMetadata

NOISE_BLOCKS = 4  # blocks no request owns, filled with noise


@dataclass(frozen=True)
class Shape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int

    def describe(self) -> str:
        return (f"{self.num_heads} query heads over {self.num_kv_heads} KV heads, head_dim "
                f"{self.head_dim}, block size {self.block_size}")


@dataclass
class Step:
    """The inputs of one ``AttentionImpl.forward`` call and what the reference needs."""

    requests: list[tuple[int, int]]  # (cached prefix, new tokens) per request
    shape: Shape
    query: torch.Tensor  # [T, heads, head_dim]
    key: torch.Tensor  # [T, kv_heads, head_dim]: the new tokens' keys
    value: torch.Tensor
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, kv_heads, head_dim]
    metadata: AttentionMetadata
    full_keys: list[torch.Tensor]  # on the host, per request: [seq_len, kv_heads, head_dim]
    full_values: list[torch.Tensor]

    @property
    def num_tokens(self) -> int:
        return self.metadata.num_actual_tokens

    def to(self, device: torch.device | str) -> Step:
        """The step with its inputs and metadata on ``device`` (host copies stay)."""
        meta = self.metadata
        moved = {f.name: getattr(meta, f.name).to(device) for f in dataclasses.fields(meta)
                 if isinstance(getattr(meta, f.name), torch.Tensor)
                 and not f.name.endswith("_cpu")}
        return dataclasses.replace(
            self, query=self.query.to(device), key=self.key.to(device),
            value=self.value.to(device), kv_cache=self.kv_cache.to(device),
            metadata=dataclasses.replace(meta, **moved))

    def request_of(self, token: int) -> int:
        starts = self.metadata.query_start_loc.tolist()
        return max(i for i in range(len(self.requests)) if starts[i] <= token)


def build_step(requests: list[tuple[int, int]], shape: Shape, dtype: torch.dtype, seed: int,
               shuffled: bool, shared_blocks: int = 0, prefix_blocks: int = 0) -> Step:
    """A step on the host. ``shuffled``: every request's blocks are random, out of order and
    interleaved with the noise blocks; else request 0 owns blocks 0.., request 1 the next
    ones, and the noise blocks come last. ``shared_blocks``: request 1's first blocks are
    request 0's (the prefix cache shares a block that request 0 fills in this very step).
    ``prefix_blocks``: every request's first blocks are request 0's, already cached (one
    prompt prefix that many requests share; each request's cached prefix covers them)."""
    gen = torch.Generator().manual_seed(seed)
    bs, kv_heads, dim = shape.block_size, shape.num_kv_heads, shape.head_dim
    needed = [-(-(cached + new) // bs) for cached, new in requests]
    num_blocks = sum(needed) + NOISE_BLOCKS
    order = list(range(num_blocks))
    if shuffled:
        random.Random(seed).shuffle(order)
        if order[0] == 0:  # else a backend that ignores the table still reads request 0 right
            order[0], order[-1] = order[-1], order[0]
    noise_block = order[-1]

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(dtype)

    kv_cache = randn(2, num_blocks, bs, kv_heads, dim)
    width = max(needed)
    block_tables = torch.full((len(requests), width), noise_block, dtype=torch.int32)
    tables: list[list[int]] = []
    for row, count in enumerate(needed):
        start = sum(needed[:row])
        tables.append(order[start:start + count])
    if shared_blocks:
        tables[1][:shared_blocks] = tables[0][:shared_blocks]
    for table in tables[1:]:
        table[:prefix_blocks] = tables[0][:prefix_blocks]
    queries: list[torch.Tensor] = []
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    full_keys: list[torch.Tensor] = []
    full_values: list[torch.Tensor] = []
    slots: list[torch.Tensor] = []
    slot_rows = kv_cache.view(2, -1, kv_heads, dim)
    for row, ((cached, new), table) in enumerate(zip(requests, tables)):
        block_tables[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
        seq_len = cached + new
        seq_keys, seq_values = randn(seq_len, kv_heads, dim), randn(seq_len, kv_heads, dim)
        shared = shared_blocks * bs if row == 1 else 0  # request 0 writes these this step
        if row and prefix_blocks:
            assert cached >= prefix_blocks * bs, "the shared prefix must be cached"
            shared = prefix_blocks * bs
        if shared:
            seq_keys[:shared] = full_keys[0][:shared]
            seq_values[:shared] = full_values[0][:shared]
        seq_slots = torch.tensor([table[pos // bs] * bs + pos % bs for pos in range(seq_len)])
        slot_rows[0, seq_slots[shared:cached]] = seq_keys[shared:cached]
        slot_rows[1, seq_slots[shared:cached]] = seq_values[shared:cached]
        queries.append(randn(new, shape.num_heads, dim))
        keys.append(seq_keys[cached:])
        values.append(seq_values[cached:])
        full_keys.append(seq_keys)
        full_values.append(seq_values)
        slots.append(seq_slots[cached:])
    query_lens = [new for _, new in requests]
    seq_lens = torch.tensor([cached + new for cached, new in requests], dtype=torch.int32)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    metadata = AttentionMetadata(
        num_actual_tokens=sum(query_lens), num_reqs=len(requests), query_start_loc=starts,
        seq_lens=seq_lens, block_tables=block_tables, slot_mapping=torch.cat(slots),
        max_query_len=max(query_lens), max_seq_len=int(seq_lens.max()),
        query_start_loc_cpu=starts.clone(), seq_lens_cpu=seq_lens.clone())
    return Step(requests, shape, torch.cat(queries), torch.cat(keys), torch.cat(values),
                kv_cache, metadata, full_keys, full_values)


def with_padding(step: Step, num_padding: int, seed: int) -> Step:
    """The step with ``num_padding`` random tokens past ``num_actual_tokens`` (a runner pads
    a batch to a captured graph's size); the metadata is unchanged."""
    gen = torch.Generator().manual_seed(seed)

    def padded(t: torch.Tensor) -> torch.Tensor:
        extra = torch.randn(num_padding, *t.shape[1:], generator=gen).to(t.dtype)
        return torch.cat([t, extra.to(t.device)])

    return dataclasses.replace(step, query=padded(step.query), key=padded(step.key),
                               value=padded(step.value))


def dense_reference(step: Step, scale: float, sliding_window: int | None) -> torch.Tensor:
    """fp64 ``[T, heads, head_dim]``: each request's attention from its full K/V."""
    outputs = []
    start = 0
    group = step.shape.num_heads // step.shape.num_kv_heads
    query_host = step.query[:step.num_tokens].cpu().double()
    for (cached, new), keys, values in zip(step.requests, step.full_keys, step.full_values):
        query = query_host[start:start + new]
        start += new
        keys = keys.double().repeat_interleave(group, dim=1)  # [s, heads, d]
        values = values.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query, keys) * scale
        query_pos = torch.arange(cached, cached + new)[:, None]
        key_pos = torch.arange(cached + new)[None, :]
        allowed = key_pos <= query_pos
        if sliding_window is not None:
            allowed &= key_pos > query_pos - sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        outputs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
    return torch.cat(outputs)


def worst_error(output: torch.Tensor, reference: torch.Tensor, step: Step) -> tuple[float, str]:
    """The largest absolute error of ``output`` (the step's real tokens) and where it is."""
    error = (output[:step.num_tokens].cpu().double() - reference).abs()
    error = torch.where(error.isnan(), torch.full_like(error, float("inf")), error)
    flat = int(error.argmax())
    token, head = divmod(flat // step.shape.head_dim, step.shape.num_heads)
    row = step.request_of(token)
    cached, new = step.requests[row]
    return float(error.max()), (f"token {token} (request {row}: {cached} cached + {new} new "
                                f"tokens), head {head}")
