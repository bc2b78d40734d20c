"""The fp8 KV cache (``--kv-cache-dtype``) in the portable and CPU attention backends, against
the conformance kit's dense fp64 reference, and the quantizer's saturation.

The reference attends the keys and values the cache can hold - each rounded to fp8 with the
layer's scale, as ``octavo.attention.kv_quant`` stores them - so what is left is the bf16
arithmetic of the backend: the kit's bf16 bound (3e-2 on unit-scale outputs) applies
unchanged. The same outputs against the unrounded keys and values are printed, to show what
fp8 itself costs (e4m3 rounds each element to within 2**-4 of its value, e5m2 2**-3).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from octavo.attention.kv_quant import (
    K_SCALE_CONSTANT,
    V_SCALE_CONSTANT,
    dequantize,
    quantize,
)
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.cpu import kv_fp8
from octavo.cpu.attention import CpuAttentionBackend
from octavo.testing.attention import DEFAULT_ATOL, MIXED_BATCH
from octavo.testing.attention_cases import Shape, Step, build_step, dense_reference, worst_error
from octavo.testing.seeds import draw_seed

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# Scales a checkpoint may give: 1.0 (vLLM's default) and one that stretches the unit-scale
# inputs (|x| < ~5) over e4m3's range, as a calibrated amax / 448 would.
SCALES = (1.0, 5.0 / 448)


def as_stored(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the fp8 cache holds it, back in fp64."""
    return dequantize(quantize(x, scale, dtype), scale, torch.float64)


def fp8_step(step: Step, dtype: torch.dtype, k_scale: float, v_scale: float) -> Step:
    """The step with its cache in fp8 (the cached context quantized as the write kernel
    would) and its reference K/V rounded as stored."""
    cache = torch.stack([quantize(step.kv_cache[0], k_scale, dtype),
                         quantize(step.kv_cache[1], v_scale, dtype)])
    return dataclasses.replace(
        step, kv_cache=cache,
        full_keys=[as_stored(k, k_scale, dtype) for k in step.full_keys],
        full_values=[as_stored(v, v_scale, dtype) for v in step.full_values])


@pytest.mark.parametrize("backend", [TorchAttentionBackend, CpuAttentionBackend],
                         ids=lambda b: b.name)
@pytest.mark.parametrize("kv_dtype", list(FP8))
@pytest.mark.parametrize("scale", SCALES)
def test_fp8_cache_matches_the_dense_reference(backend, kv_dtype: str, scale: float) -> None:
    seed = draw_seed()
    dtype = FP8[kv_dtype]
    shape = Shape(num_heads=6, num_kv_heads=2, head_dim=64, block_size=16)
    exact = build_step(MIXED_BATCH, shape, torch.bfloat16, seed, shuffled=True)
    step = fp8_step(exact, dtype, scale, 2 * scale)
    impl = backend.make_impl(shape.num_heads, shape.head_dim, shape.head_dim**-0.5,
                             shape.num_kv_heads)
    impl.k_scale, impl.v_scale = scale, 2 * scale
    output = impl.forward(step.query, step.key, step.value, step.kv_cache, step.metadata)
    error, where = worst_error(output, dense_reference(step, shape.head_dim**-0.5, None), step)
    fp8_cost, _ = worst_error(output, dense_reference(exact, shape.head_dim**-0.5, None), exact)
    print(f"\nseed {seed} {backend.name} {kv_dtype} scales {scale:.4g}/{2 * scale:.4g}: "
          f"max error {error:.3g} vs the fp8-rounded reference, {fp8_cost:.3g} vs exact K/V")
    assert error <= DEFAULT_ATOL[torch.bfloat16], where
    # The new tokens were written as the cache stores them: the rounded values, scaled.
    rows = step.kv_cache.view(2, -1, shape.num_kv_heads * shape.head_dim)
    slots = step.metadata.slot_mapping
    written = rows[0].view(torch.uint8)[slots].view(dtype)
    expected = quantize(step.key.flatten(1), scale, dtype)
    assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("kv_dtype", list(FP8))
def test_quantize_saturates_instead_of_overflowing(kv_dtype: str) -> None:
    dtype = FP8[kv_dtype]
    limit = torch.finfo(dtype).max
    x = torch.tensor([1e9, -1e9, limit * 3, 0.5, -2.0], dtype=torch.bfloat16)
    stored = quantize(x, 1.0, dtype).float()
    assert stored.tolist() == [limit, -limit, limit, 0.5, -2.0]
    assert torch.equal(quantize(x, 0.25, dtype).float()[3:], torch.tensor([2.0, -8.0]))
    # An fp32 model's keys are left as they were (x.float() is x itself: once clamped in place).
    keys = x.float()
    assert quantize(keys, 1.0, dtype).float().tolist() == stored.tolist()
    assert keys.tolist() == x.float().tolist()


def test_calculated_scales_are_taken_once_from_the_first_keys_and_values() -> None:
    """vLLM's calc_kv_scales: max |key| / 200 and max |value| / 100 of the first step that has
    any (an all-zero one leaves the layer waiting), kept for every later step."""
    impl = TorchAttentionBackend.make_impl(2, 4, 0.5, 1)
    impl.calculate_kv_scales = True
    impl.maybe_calc_kv_scales(torch.zeros(3, 1, 4), torch.ones(3, 1, 4))
    assert (impl.k_scale, impl.v_scale, impl.calculate_kv_scales) == (1.0, 1.0, True)
    key = torch.tensor([[[1.0, -50.0, 2.0, 0.0]]])
    impl.maybe_calc_kv_scales(key, -3 * key)
    assert (impl.k_scale, impl.v_scale) == (50.0 / K_SCALE_CONSTANT, 150.0 / V_SCALE_CONSTANT)
    impl.maybe_calc_kv_scales(10 * key, 10 * key)
    assert (impl.k_scale, impl.v_scale) == (50.0 / K_SCALE_CONSTANT, 150.0 / V_SCALE_CONSTANT)


@pytest.mark.parametrize("kv_dtype", list(FP8))
def test_the_c_write_stores_torchs_bytes(kv_dtype: str) -> None:
    """Every magnitude from below the smallest subnormal to past saturation, ties
    included: the C kernel's rounding is torch's, byte for byte."""
    if not kv_fp8.usable(torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1, dtype=FP8[kv_dtype])):
        pytest.skip("the CPU kernels are not built here")
    dtype = FP8[kv_dtype]
    gen = torch.Generator().manual_seed(seed := draw_seed())
    width, tokens = 96, 64
    magnitudes = torch.exp2(torch.empty(tokens, width).uniform_(-24, 20, generator=gen))
    signs = torch.randint(0, 2, (tokens, width), generator=gen) * 2 - 1
    keys = (magnitudes * signs).to(torch.bfloat16)
    values = keys.flip(0)
    cache = torch.zeros(2, tokens + 5, width, dtype=dtype)
    slots = torch.randperm(tokens + 5, generator=gen)[:tokens]
    kv_fp8.write_kv_fp8(cache, keys, values, slots, 0.75, 3.0)
    print(f"seed {seed}")
    for plane, rows, scale in ((0, keys, 0.75), (1, values, 3.0)):
        assert torch.equal(cache[plane, slots].view(torch.uint8),
                           quantize(rows, scale, dtype).view(torch.uint8))
