"""``reshape_and_cache`` against torch's ``index_copy_`` into the flattened cache (what the
portable backend's ``write_kv`` does): every token lands at its slot, nothing else in the
cache changes; an fp8 cache holds ``value / scale`` rounded as torch rounds it."""

from __future__ import annotations

import pytest
import torch

from octavo.testing.seeds import draw_seed
from octavo_triton.kernels.kv_cache import reshape_and_cache

from .helpers import DEVICE, DTYPES

NUM_BLOCKS, KV_HEADS = 6, 4


def make_inputs(num_tokens: int, block_size: int, head_dim: int, dtype: torch.dtype,
                seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """key and value as views into one fused projection, and distinct random slots."""
    gen = torch.Generator().manual_seed(seed)
    fused = torch.randn(num_tokens, 3, KV_HEADS, head_dim, generator=gen).to(dtype).to(DEVICE)
    slots = torch.randperm(NUM_BLOCKS * block_size, generator=gen)[:num_tokens].to(DEVICE)
    return fused[:, 1], fused[:, 2], slots


def expected_cache(cache: torch.Tensor, new: torch.Tensor, slots: torch.Tensor,
                   ) -> torch.Tensor:
    """``cache`` with ``new`` (converted to its dtype) at ``slots``; fp8 moved as bytes,
    which ``index_copy_`` supports on every device."""
    expected, new = cache.clone(), new.to(cache.dtype)
    if cache.dtype.itemsize == 1:
        expected, new = expected.view(torch.uint8), new.view(torch.uint8)
    expected.view(-1, *cache.shape[2:]).index_copy_(0, slots, new)
    return expected.view(cache.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("block_size", "head_dim"), [(16, 64), (32, 128), (16, 256)])
def test_tokens_land_in_their_slots(dtype: torch.dtype, block_size: int, head_dim: int) -> None:
    seed = draw_seed()
    key, value, slots = make_inputs(37, block_size, head_dim, dtype, seed)
    shape = (NUM_BLOCKS, block_size, KV_HEADS, head_dim)
    key_cache = torch.randn(shape).to(dtype).to(DEVICE)
    value_cache = torch.randn(shape).to(dtype).to(DEVICE)
    want_key = expected_cache(key_cache, key, slots)
    want_value = expected_cache(value_cache, value, slots)

    reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, want_key), f"seed {seed}"
    assert torch.equal(value_cache, want_value), f"seed {seed}"


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_cache_with_scale(fp8: torch.dtype, dtype: torch.dtype) -> None:
    seed = draw_seed()
    key, value, slots = make_inputs(21, 16, 128, dtype, seed)
    key, value = key * 30, value / 10  # keys beyond e4m3's range until scaled
    k_scale, v_scale = 0.25, 0.01
    shape = (NUM_BLOCKS, 16, KV_HEADS, 128)
    key_cache = torch.zeros(shape, dtype=fp8, device=DEVICE)
    value_cache = torch.zeros(shape, dtype=fp8, device=DEVICE)
    want_key = expected_cache(key_cache, key.float() / k_scale, slots)
    want_value = expected_cache(value_cache, value.float() / v_scale, slots)

    reshape_and_cache(key, value, key_cache, value_cache, slots, k_scale, v_scale)
    # fp8 has no torch.equal on every device: compare the bits.
    assert torch.equal(key_cache.view(torch.uint8), want_key.view(torch.uint8)), f"seed {seed}"
    assert torch.equal(value_cache.view(torch.uint8), want_value.view(torch.uint8)), (
        f"seed {seed}")


def test_mismatched_shapes_are_refused() -> None:
    key = torch.zeros(3, KV_HEADS, 64, device=DEVICE)
    cache = torch.zeros(NUM_BLOCKS, 16, KV_HEADS, 32, device=DEVICE)
    slots = torch.arange(3, device=DEVICE)
    with pytest.raises(ValueError, match="does not hold 4 kv heads of 64"):
        reshape_and_cache(key, key, cache, cache, slots)
    with pytest.raises(ValueError, match="differ in shape"):
        reshape_and_cache(key, key[:, :2], cache, cache, slots)
