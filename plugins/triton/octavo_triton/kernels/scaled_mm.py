"""Scaled GEMMs of fp8 (e4m3) and int8 (W8A8) checkpoints, and the per-token quantizer of
their activations.

``scaled_mm(a, b, a_scale, b_scale)`` is ``(a @ b.T) * a_scale * b_scale`` for quantized
``a`` [M, K] and ``b`` [N, K] - vLLM's ``cutlass_scaled_mm``/``triton_scaled_mm``
contract (vllm/model_executor/layers/quantization/compressed_tensors/triton_scaled_mm.py):
``a_scale`` is one scale (static) or one per token [M], ``b_scale`` one (per-tensor) or
one per output channel [N]. ``b`` may be a transposed view of a [K, N] tensor. The
products accumulate in int32 for int8 and in fp32 for fp8, and the scales are applied
once, to the accumulator.

``quantize_per_token(x, dtype, scale=None)`` quantizes ``x`` [M, K] to fp8 or int8: with no
``scale`` each row gets ``amax(|row|) / max(dtype)`` (dynamic per-token, the
compressed-tensors W8A8 scheme), else the given static scale. int8 values are
``x / scale`` rounded half away from zero and clamped to [-128, 127]; fp8 values are
``x / scale`` clamped to the format's range and rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64
BLOCK_K = 64
QUANTIZE_BLOCK = 1024
MIN_SCALE = 1e-12  # of an all-zero row: its values quantize to 0


@triton.jit
def scaled_mm_kernel(out_ptr, a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, M, N, K,
                     stride_a, stride_bn, stride_bk, stride_out,
                     PER_TOKEN: tl.constexpr, PER_CHANNEL: tl.constexpr,
                     INT8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    a_rows = a_ptr + m[:, None].to(tl.int64) * stride_a
    b_cols = b_ptr + n[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if INT8 else tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_cols + k[:, None] * stride_bk, mask=(k[:, None] < K) & (n[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b, out_dtype=tl.int32 if INT8 else tl.float32)
    if PER_TOKEN:
        a_scale = tl.load(a_scale_ptr + m, mask=m < M, other=0.0)[:, None]
    else:
        a_scale = tl.load(a_scale_ptr)
    if PER_CHANNEL:
        b_scale = tl.load(b_scale_ptr + n, mask=n < N, other=0.0)[None, :]
    else:
        b_scale = tl.load(b_scale_ptr)
    out = acc.to(tl.float32) * a_scale * b_scale
    tl.store(out_ptr + m[:, None].to(tl.int64) * stride_out + n[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(m[:, None] < M) & (n[None, :] < N))


@triton.jit
def quantize_per_token_kernel(out_ptr, scale_ptr, x_ptr, K, stride_x, stride_out, qmax,
                              STATIC: tl.constexpr, INT8: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    src = x_ptr + row * stride_x
    if STATIC:
        scale = tl.load(scale_ptr)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(src + k0 + cols, mask=k0 + cols < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        # div_rn: a correctly rounded division, as torch's (a GPU's "/" may not be).
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), qmax), 1e-12)
        tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        mask = k0 + cols < K
        v = tl.math.div_rn(tl.load(src + k0 + cols, mask=mask, other=0.0).to(tl.float32),
                           scale)
        if INT8:
            v = tl.where(v >= 0, tl.floor(v + 0.5), tl.ceil(v - 0.5))
            v = tl.minimum(tl.maximum(v, -128.0), 127.0)
        else:
            v = tl.minimum(tl.maximum(v, -qmax), qmax)
        tl.store(out_ptr + row * stride_out + k0 + cols, v.to(out_ptr.dtype.element_ty),
                 mask=mask)


def _qmax(dtype: torch.dtype) -> float:
    if dtype == torch.int8:
        return 127.0
    if dtype.is_floating_point and dtype.itemsize == 1:
        return float(torch.finfo(dtype).max)
    raise ValueError(f"cannot quantize activations to {dtype}: an fp8 dtype or int8")


def quantize_per_token(x: torch.Tensor, dtype: torch.dtype,
                       scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_q, scale)``: ``x`` [M, K] quantized to ``dtype``, and the [M] float32 scales
    (dynamic) or the given one-element static ``scale``."""
    qmax = _qmax(dtype)
    rows = x if x.stride(-1) == 1 else x.contiguous()
    m, k = rows.shape
    out = torch.empty(m, k, dtype=dtype, device=x.device)
    if scale is not None:
        if scale.numel() != 1:
            raise ValueError(f"a static activation scale is one value, got {scale.numel()}")
        scales = scale.reshape(1).to(torch.float32)
    else:
        scales = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        quantize_per_token_kernel[(m,)](
            out, scales, rows, k, rows.stride(0), out.stride(0), qmax,
            STATIC=scale is not None, INT8=dtype == torch.int8,
            BLOCK=min(QUANTIZE_BLOCK, triton.next_power_of_2(k)))
    return out, scales


def e4m3fn_to_fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor,
                                                                        torch.Tensor]:
    """An OCP e4m3fn weight and its scale as MI300's e4m3fnuz, the fp8 its dot takes (the
    ``fp8e4b8`` builds): the same bits, whose value fnuz's exponent bias (8, not 7) halves,
    so the scale doubles - except 0x80, -0 in e4m3fn and NaN in fnuz, which becomes 0 (as
    vLLM's ``normalize_e4m3fn_to_e4m3fnuz`` does)."""
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"e4m3fn_to_fnuz converts a float8_e4m3fn weight, not {weight.dtype}")
    bits = weight.view(torch.int8)
    bits = torch.where(bits == -128, torch.zeros_like(bits), bits)
    return bits.view(torch.float8_e4m3fnuz), scale * 2


def scaled_mm(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
    """``(a @ b.T) * a_scale * b_scale`` in ``out_dtype``, for ``a`` [M, K] and ``b`` [N, K]
    both int8 or both fp8; ``a_scale`` [1] or [M], ``b_scale`` [1] or [N], float32."""
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k or a.dtype != b.dtype:
        raise ValueError(f"scaled_mm: a {tuple(a.shape)} {a.dtype} and b {tuple(b.shape)} "
                         f"{b.dtype} must be [M, K] and [N, K] of one dtype")
    _qmax(a.dtype)
    if a_scale.numel() not in (1, m) or b_scale.numel() not in (1, n):
        raise ValueError(f"scaled_mm: a_scale has {a_scale.numel()} values (1 or {m}), "
                         f"b_scale {b_scale.numel()} (1 or {n})")
    a = a if a.stride(-1) == 1 else a.contiguous()
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    if m:
        scaled_mm_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, BLOCK_N))](
            out, a, b, a_scale.to(torch.float32), b_scale.to(torch.float32), m, n, k,
            a.stride(0), b.stride(0), b.stride(1), out.stride(0),
            PER_TOKEN=a_scale.numel() > 1,
            PER_CHANNEL=b_scale.numel() > 1, INT8=a.dtype == torch.int8,
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out
