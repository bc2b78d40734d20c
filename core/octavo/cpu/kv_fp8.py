"""The fp8 KV cache's C kernels (cpu_kv_fp8.c): a step's keys and values written as fp8, and
decode rows attended straight from the fp8 cache, as ``octavo.attention.kv_quant`` stores and
reads them (the same bytes; outputs within bf16 rounding of the portable path's)."""

from __future__ import annotations

import torch

from octavo.cpu.kernels import HEADER, check_status, library

FORMATS = {torch.float8_e4m3fn: HEADER.constants["OCTAVO_FP8_E4M3"],
           torch.float8_e5m2: HEADER.constants["OCTAVO_FP8_E5M2"]}


def usable(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether these kernels take the layer: a bf16 query on the CPU over an fp8 cache."""
    return (query.dtype is torch.bfloat16 and query.is_cpu and kv_cache.dtype in FORMATS
            and kv_cache.is_cpu and library() is not None)


def write_kv_fp8(cache_rows: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 slots: torch.Tensor, k_scale: float, v_scale: float) -> None:
    """``kv_quant.write_kv_fp8`` in C: ``key``/``value`` bf16 rows [T, width] (row-contiguous)
    quantized into ``cache_rows`` [2, slots, width] (fp8, contiguous) at ``slots``."""
    assert key.stride(1) == 1 and value.stride(1) == 1 and cache_rows.is_contiguous()
    assert slots.dtype == torch.int64 and slots.is_contiguous()
    lib = library()
    assert lib is not None
    lib.octavo_write_kv_fp8(cache_rows.data_ptr(), cache_rows.shape[1], key.data_ptr(),
                            value.data_ptr(), slots.data_ptr(), key.shape[0], key.shape[1],
                            key.stride(0), value.stride(0), 1.0 / k_scale, 1.0 / v_scale,
                            FORMATS[cache_rows.dtype])


def decode_attention_fp8(q: torch.Tensor, cache_rows: torch.Tensor, slots: torch.Tensor,
                         seq_lens: torch.Tensor, max_len: int, num_kv_heads: int, scale: float,
                         k_scale: float, v_scale: float) -> torch.Tensor:
    """One query token per row (``q`` [B, heads, D] bf16) over its context in the fp8 cache,
    as ``kernels.decode_attention`` takes them (``slots`` [B * max_len], ``seq_lens`` [B],
    int64); bf16 [B, heads, D]."""
    batch, num_heads, head_dim = q.shape
    assert q.stride()[1:] == (head_dim, 1) and cache_rows.is_contiguous()
    slots, seq_lens = slots.contiguous(), seq_lens.contiguous()
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype)
    lib = library()
    assert lib is not None
    check_status("octavo_decode_attention_fp8", lib.octavo_decode_attention_fp8(
        out.data_ptr(), q.data_ptr(), cache_rows.data_ptr(), cache_rows.shape[1],
        slots.data_ptr(), seq_lens.data_ptr(), batch, max_len, num_heads, num_kv_heads,
        head_dim, q.stride(0), scale, k_scale, v_scale, FORMATS[cache_rows.dtype]))
    return out
