"""The portable paged-attention backend against a naive dense reference.

Each case is a batch of requests, each with a cached prefix already in the paged cache and
some new tokens (a whole prompt, a chunk over a cached prefix, or a single decode token).
The reference recomputes every request's attention from its full, unpaged K/V sequence with
a plain softmax(QK^T)V; the backend must match it and leave the new K/V in their slots.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from octavo.attention.base import AttentionMetadata
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.cpu import kernels as cpu_kernels
from octavo.cpu.attention import CpuAttentionBackend
from octavo.plugins import get_registries

pytestmark = pytest.mark.usefixtures("single_thread")

NUM_KV_HEADS = 2
# (cached prefix, new tokens): fresh prompts, chunks over a cached prefix, decodes.
MIXED_BATCH = [(0, 37), (50, 20), (33, 1), (70, 1), (0, 1), (16, 16), (5, 3)]
DECODE_BATCH = [(0, 1), (15, 1), (16, 1), (63, 1), (100, 1)]


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2**32)


@dataclass
class Case:
    """A step of requests laid out in a random, non-contiguous paged cache."""

    query: torch.Tensor  # [T, heads, head_dim]
    key: torch.Tensor  # [T, kv_heads, head_dim]: the new tokens' keys
    value: torch.Tensor
    full_keys: list[torch.Tensor]  # per request: [seq_len, kv_heads, head_dim]
    full_values: list[torch.Tensor]
    kv_cache: torch.Tensor
    metadata: AttentionMetadata


def make_case(requests: list[tuple[int, int]], num_heads: int, head_dim: int,
              block_size: int, dtype: torch.dtype, seed: int) -> Case:
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    seq_lens = [cached + new for cached, new in requests]
    blocks_needed = [-(-length // block_size) for length in seq_lens]
    num_blocks = sum(blocks_needed) + 5
    # Random, non-contiguous blocks; the unused ones hold noise that must never be read.
    free = list(range(num_blocks))
    rng.shuffle(free)
    kv_cache = torch.randn(2, num_blocks, block_size, NUM_KV_HEADS, head_dim, generator=gen,
                           dtype=dtype)
    max_blocks = max(blocks_needed) + 2
    block_tables = torch.zeros(len(requests), max_blocks, dtype=torch.int32)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    queries, keys, values, full_keys, full_values, slots = [], [], [], [], [], []
    for row, ((cached, new), needed) in enumerate(zip(requests, blocks_needed)):
        table = [free.pop() for _ in range(needed)]
        block_tables[row, :needed] = torch.tensor(table)
        seq_len = cached + new
        seq_keys, seq_values = randn(seq_len, NUM_KV_HEADS, head_dim), randn(
            seq_len, NUM_KV_HEADS, head_dim)
        seq_slots = torch.tensor([table[pos // block_size] * block_size + pos % block_size
                                  for pos in range(seq_len)])
        # The cached prefix is already in the cache; the new tokens come with the step.
        kv_cache[0].view(-1, NUM_KV_HEADS, head_dim)[seq_slots[:cached]] = seq_keys[:cached]
        kv_cache[1].view(-1, NUM_KV_HEADS, head_dim)[seq_slots[:cached]] = seq_values[:cached]
        queries.append(randn(new, num_heads, head_dim))
        keys.append(seq_keys[cached:])
        values.append(seq_values[cached:])
        full_keys.append(seq_keys)
        full_values.append(seq_values)
        slots.append(seq_slots[cached:])

    query_lens = [new for _, new in requests]
    starts = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32)
    metadata = AttentionMetadata(
        num_actual_tokens=sum(query_lens),
        num_reqs=len(requests),
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        slot_mapping=torch.cat(slots),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return Case(torch.cat(queries), torch.cat(keys), torch.cat(values), full_keys, full_values,
                kv_cache, metadata)


def dense_reference(case: Case, requests: list[tuple[int, int]], scale: float,
                    sliding_window: int | None) -> torch.Tensor:
    """softmax(QK^T)V per request in fp64 from the full K/V, query j at position s - q + j."""
    outputs = []
    start = 0
    for (cached, new), keys, values in zip(requests, case.full_keys, case.full_values):
        query = case.query[start:start + new].double()
        start += new
        num_heads = query.shape[1]
        group = num_heads // NUM_KV_HEADS
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


def run_backend(case: Case, num_heads: int, head_dim: int,
                sliding_window: int | None = None,
                backend: type[TorchAttentionBackend] = TorchAttentionBackend) -> torch.Tensor:
    impl = backend.make_impl(num_heads, head_dim, head_dim**-0.5, NUM_KV_HEADS, sliding_window)
    return impl.forward(case.query, case.key, case.value, case.kv_cache, case.metadata)


def check(requests, num_heads, head_dim, block_size, dtype=torch.float32, sliding_window=None,
          atol=1e-5, backend=TorchAttentionBackend) -> None:
    seed = fresh_seed()
    case = make_case(requests, num_heads, head_dim, block_size, dtype, seed)
    out = run_backend(case, num_heads, head_dim, sliding_window, backend)
    expected = dense_reference(case, requests, head_dim**-0.5, sliding_window)
    assert out.dtype == dtype and out.shape == case.query.shape
    diff = (out.double() - expected).abs().max().item()
    assert diff < atol, f"seed={seed} max abs diff {diff}"
    # The new keys/values are now in their slots.
    flat = case.kv_cache.view(2, -1, NUM_KV_HEADS, head_dim)
    assert torch.equal(flat[0][case.metadata.slot_mapping], case.key), f"seed={seed}"
    assert torch.equal(flat[1][case.metadata.slot_mapping], case.value), f"seed={seed}"


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("gqa_ratio", [1, 3, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mixed_batch_matches_dense_reference(block_size, gqa_ratio, head_dim):
    check(MIXED_BATCH, NUM_KV_HEADS * gqa_ratio, head_dim, block_size)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("gqa_ratio", [1, 3, 8])
def test_decode_only_batch_matches_dense_reference(block_size, gqa_ratio):
    check(DECODE_BATCH, NUM_KV_HEADS * gqa_ratio, 64, block_size)


@pytest.mark.parametrize("sliding_window", [1, 7, 20])
@pytest.mark.parametrize("block_size", [16, 32])
def test_sliding_window_matches_dense_reference(sliding_window, block_size):
    check(MIXED_BATCH + DECODE_BATCH, NUM_KV_HEADS * 3, 64, block_size,
          sliding_window=sliding_window)


@pytest.mark.parametrize("fused_kernels", ["1", "0"])
def test_bf16_matches_dense_reference(fused_kernels: str, monkeypatch: pytest.MonkeyPatch):
    """bf16 on the CPU platform's backend: KV writes and decodes by the fused kernels
    (octavo.cpu.kernels), or with them off, all in PyTorch."""
    monkeypatch.setenv(cpu_kernels.ENABLE_ENV, fused_kernels)
    cpu_kernels.library.cache_clear()
    try:
        check(MIXED_BATCH + DECODE_BATCH, NUM_KV_HEADS * 4, 64, 16, dtype=torch.bfloat16,
              atol=3e-2, backend=CpuAttentionBackend)
    finally:
        monkeypatch.undo()
        cpu_kernels.library.cache_clear()


def test_padding_tokens_past_num_actual_tokens_are_ignored():
    seed = fresh_seed()
    case = make_case(MIXED_BATCH, 4, 64, 16, torch.float32, seed)
    expected = run_backend(case, 4, 64)
    padded = Case(*[torch.cat([t, torch.randn(3, *t.shape[1:])]) for t in
                    (case.query, case.key, case.value)], case.full_keys, case.full_values,
                  case.kv_cache, case.metadata)
    out = run_backend(padded, 4, 64)
    assert torch.allclose(out[:-3], expected, atol=1e-6, rtol=0), f"seed={seed}"
    assert torch.count_nonzero(out[-3:]) == 0


def test_backends_are_registered_as_torch_and_cpu():
    assert get_registries().attention_backends.get("torch") is TorchAttentionBackend
    assert get_registries().attention_backends.get("cpu") is CpuAttentionBackend
