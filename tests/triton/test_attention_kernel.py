"""The Triton paged-attention kernels against a dense fp64 reference.

The cases are the conformance kit's (tests/attention_cases.py): a step of requests laid out
in a random, non-contiguous paged cache, each with a cached prefix already there and new
tokens (whole prompts, chunks over a cached prefix, single
decode tokens), lengths crossing block boundaries, noise in every unused block. The new
K/V go through ``reshape_and_cache`` first, as the backend does, so the attention reads
what the cache kernel wrote.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from octavo.testing.seeds import draw_seed
from octavo_triton import tuning
from octavo_triton.kernels.attention import paged_attention, split_kv_segments
from octavo_triton.kernels.kv_cache import reshape_and_cache
from tests.attention_cases import (
    MIXED_BATCH,
    NUM_KV_HEADS,
    Case,
    dense_reference,
    make_case,
)

from .helpers import ATTENTION_ATOL, DEVICE

# Long decode contexts, short ones, and one with a single token.
LONG_DECODES = [(700, 1), (95, 1), (0, 1), (300, 1)]


def on_device(case: Case) -> Case:
    meta = case.metadata
    tensors = {f.name: getattr(meta, f.name).to(DEVICE) for f in dataclasses.fields(meta)
               if isinstance(getattr(meta, f.name), torch.Tensor)}
    return dataclasses.replace(
        case, query=case.query.to(DEVICE), key=case.key.to(DEVICE),
        value=case.value.to(DEVICE), kv_cache=case.kv_cache.to(DEVICE),
        metadata=dataclasses.replace(meta, **tensors))


def run_step(case: Case, scale: float, sliding_window: int | None = None,
             kv_scale: float = 1.0, kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Write the step's K/V, then attend - the backend's two launches."""
    kv_cache = case.kv_cache
    if kv_dtype is not None:
        kv_cache = (kv_cache.float() / kv_scale).to(kv_dtype)
    case = on_device(dataclasses.replace(case, kv_cache=kv_cache))
    key_cache, value_cache = case.kv_cache[0], case.kv_cache[1]
    reshape_and_cache(case.key, case.value, key_cache, value_cache, case.metadata.slot_mapping,
                      kv_scale, kv_scale)
    out = torch.empty_like(case.query)
    paged_attention(out, case.query, key_cache, value_cache, case.metadata, scale,
                    sliding_window, kv_scale, kv_scale)
    return out.cpu()


def check(requests: list[tuple[int, int]], num_heads: int, head_dim: int, block_size: int,
          dtype: torch.dtype, sliding_window: int | None = None) -> None:
    seed = draw_seed()
    case = make_case(requests, num_heads, head_dim, block_size, dtype, seed)
    scale = head_dim**-0.5
    got = run_step(case, scale, sliding_window)
    want = dense_reference(case, requests, scale, sliding_window)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=ATTENTION_ATOL[dtype],
                               msg=lambda m: f"seed {seed}: {m}")


@pytest.fixture
def split_early():
    """Split-KV from short contexts on, in 4 segments, so small cases take that path."""
    tuning.set_tuning(tuning.KernelTuning("split-early", split_kv_min_seq_len=64,
                                          split_kv_segments=4))
    yield tuning.active_tuning()
    tuning.set_tuning(tuning.DEFAULT_TUNING)


# Every dtype, GQA group (query heads per kv head) 1/4/8, head dim 64/128/256 and block size
# 16/32 appear at least twice; a group of 3 needs padded tile rows.
@pytest.mark.parametrize(("dtype", "group", "head_dim", "block_size"), [
    (torch.float32, 1, 64, 16),
    (torch.float16, 4, 128, 32),
    (torch.bfloat16, 8, 256, 16),
    (torch.bfloat16, 4, 64, 32),
    (torch.float16, 1, 256, 32),
    (torch.float32, 8, 128, 16),
    (torch.float32, 3, 64, 16),
])
def test_mixed_batch(dtype: torch.dtype, group: int, head_dim: int, block_size: int) -> None:
    check(MIXED_BATCH, group * NUM_KV_HEADS, head_dim, block_size, dtype)


@pytest.mark.parametrize(("dtype", "block_size", "window"), [
    (torch.float32, 16, 8), (torch.float16, 32, 20)])
def test_sliding_window(dtype: torch.dtype, block_size: int, window: int) -> None:
    check(MIXED_BATCH, 4 * NUM_KV_HEADS, 64, block_size, dtype, sliding_window=window)


@pytest.mark.parametrize(("dtype", "group", "head_dim", "block_size", "window"), [
    (torch.float32, 4, 64, 16, None), (torch.bfloat16, 8, 128, 32, 50)])
def test_split_kv_decode(split_early: tuning.KernelTuning, dtype: torch.dtype, group: int,
                         head_dim: int, block_size: int, window: int | None) -> None:
    case = make_case(LONG_DECODES, group * NUM_KV_HEADS, head_dim, block_size, dtype, 0)
    assert split_kv_segments(case.metadata, NUM_KV_HEADS, split_early) == 4
    check(LONG_DECODES, group * NUM_KV_HEADS, head_dim, block_size, dtype, window)


def test_no_split_for_prompts_or_short_contexts() -> None:
    default = tuning.DEFAULT_TUNING
    long_decodes = make_case(LONG_DECODES, 2, 16, 16, torch.float32, 0).metadata
    assert split_kv_segments(long_decodes, NUM_KV_HEADS, default) == default.split_kv_segments
    mixed = make_case(MIXED_BATCH, 2, 16, 16, torch.float32, 0).metadata
    assert split_kv_segments(mixed, NUM_KV_HEADS, default) == 1
    short = make_case([(30, 1), (5, 1)], 2, 16, 16, torch.float32, 0).metadata
    assert split_kv_segments(short, NUM_KV_HEADS, default) == 1


@pytest.mark.parametrize(("dtype", "fp8", "kv_scale"), [
    (torch.bfloat16, torch.float8_e4m3fn, 0.02), (torch.float16, torch.float8_e5m2, 4.0)])
def test_fp8_cache(dtype: torch.dtype, fp8: torch.dtype, kv_scale: float) -> None:
    """The cache holds K/V / scale in fp8; attention must equal attention over the K/V
    that the fp8 values stand for."""
    seed = draw_seed()
    requests = MIXED_BATCH[:4]
    case = make_case(requests, 4 * NUM_KV_HEADS, 128, 16, dtype, seed)
    got = run_step(case, 128**-0.5, kv_scale=kv_scale, kv_dtype=fp8)

    def through_fp8(x: torch.Tensor) -> torch.Tensor:
        return ((x.float() / kv_scale).to(fp8).float() * kv_scale).to(dtype)

    quantized = dataclasses.replace(case, full_keys=[through_fp8(k) for k in case.full_keys],
                                    full_values=[through_fp8(v) for v in case.full_values])
    want = dense_reference(quantized, requests, 128**-0.5, None)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=ATTENTION_ATOL[dtype],
                               msg=lambda m: f"seed {seed}: {m}")


def test_block_filled_this_step_is_read_by_another_request() -> None:
    """The contract's write-before-read rule: request 1's cached prefix is two blocks that
    request 0 fills in this very step (the prefix cache shares them)."""
    seed = draw_seed()
    requests = [(0, 40), (32, 5)]
    case = make_case(requests, 8, 64, 16, torch.float16, seed)
    case.metadata.block_tables[1, :2] = case.metadata.block_tables[0, :2]
    case.full_keys[1][:32] = case.full_keys[0][:32]
    case.full_values[1][:32] = case.full_values[0][:32]
    got = run_step(case, 0.125)
    want = dense_reference(case, requests, 0.125, None)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=ATTENTION_ATOL[torch.float16],
                               msg=lambda m: f"seed {seed}: {m}")
