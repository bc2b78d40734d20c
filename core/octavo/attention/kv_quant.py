"""An fp8 KV cache (``--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2``): keys and values stored one
byte per element, as vLLM stores them.

A layer's keys are stored as ``key / k_scale`` and values as ``value / v_scale``, rounded to
the nearest fp8 value and saturated at the format's largest finite value (448 for e4m3, 57344
for e5m2) - an overflow becomes the largest value, never NaN or inf. Reading multiplies back
by the scale. The scales are per layer (``AttentionImpl.k_scale`` / ``v_scale``): the
checkpoint's where it has them (``octavo.models.kv_scales``), else 1.0, vLLM's default -
SmolLM2's keys and values lie well inside e4m3's range, whose relative rounding error is at
most 2**-4 (e5m2: 2**-3). With ``--calculate-kv-scales`` each layer measures its own from
the first keys and values it writes (:func:`calculated_scales`, vLLM's ``calc_kv_scales``).
A scale moves only which values fall below the format's smallest normal (2**-6 for e4m3),
where the relative error grows; above it the rounding error is relative and the same at any
scale.
"""

from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# vLLM's K_SCALE_CONSTANT and V_SCALE_CONSTANT: a calculated scale maps the first batch's
# largest |key| to 200 and |value| to 100, leaving e4m3 (448) room for larger later ones.
K_SCALE_CONSTANT = 200.0
V_SCALE_CONSTANT = 100.0


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` in fp8 ``dtype``, saturated at its largest finite value."""
    limit = torch.finfo(dtype).max
    # Times the reciprocal, not divided: the C kernel computes the same fp32 product. Not
    # clamped in place: x.float() of an fp32 x is x itself, the caller's keys.
    scaled = x.float() if scale == 1.0 else x.float() * (1.0 / scale)
    return scaled.clamp(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored fp8 ``x`` back in ``dtype``, times ``scale``."""
    out = x.to(dtype)
    return out if scale == 1.0 else out.mul_(scale)


def write_kv_fp8(cache_rows: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 slots: torch.Tensor, k_scale: float, v_scale: float) -> None:
    """Store the step's keys and values (``[T, kv_heads * head_dim]``) at ``slots`` of an fp8
    ``cache_rows`` (``[2, slots, kv_heads * head_dim]``), quantized with the layer's scales.
    The copy moves bytes (torch has no fp8 ``index_copy_`` on every device)."""
    rows = cache_rows.view(torch.uint8)
    rows[0].index_copy_(0, slots, quantize(key, k_scale, cache_rows.dtype).view(torch.uint8))
    rows[1].index_copy_(0, slots, quantize(value, v_scale, cache_rows.dtype).view(torch.uint8))


def read_kv_fp8(cache_rows: torch.Tensor, slots: torch.Tensor, k_scale: float, v_scale: float,
                dtype: torch.dtype) -> torch.Tensor:
    """The keys and values of ``slots`` (``[2, len(slots), width]``) from an fp8
    ``cache_rows``, dequantized to ``dtype``."""
    stored = cache_rows.view(torch.uint8).index_select(1, slots).view(cache_rows.dtype)
    return torch.stack([dequantize(stored[0], k_scale, dtype),
                        dequantize(stored[1], v_scale, dtype)])


def round_trip(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the cache of fp8 ``dtype`` gives it back: what a fresh prompt attends, so it
    sees the same keys as a later chunk reading them from the cache."""
    return dequantize(quantize(x, scale, dtype), scale, x.dtype)


def calculated_scales(key: torch.Tensor, value: torch.Tensor) -> tuple[float, float] | None:
    """vLLM's ``calc_kv_scales``: ``max|key| / 200`` and ``max|value| / 100``; None while
    either is all zeros (no scale to take from it)."""
    k_max, v_max = (float(x.abs().max()) if x.numel() else 0.0 for x in (key, value))
    if not (k_max > 0.0 and v_max > 0.0):
        return None
    return k_max / K_SCALE_CONSTANT, v_max / V_SCALE_CONSTANT
