"""W4A16 (and 8-bit GPTQ) GEMM: ``x @ W`` with ``W`` dequantized in registers, tile by
tile, from an AWQ or GPTQ checkpoint's packed int32 tensors - the weight never exists in
floating point in memory.

The layouts, for ``x`` [M, K] (K = in features, N = out features), ``g`` the group size:

- **AWQ**, GEMM version (the ``AutoAWQ`` package, ``awq/modules/linear/gemm.py``; vLLM's
  ``awq_triton.py``): ``qweight`` int32 [K, N/8], ``qzeros`` int32 [K/g, N/8], ``scales``
  [K/g, N]. Each int32 holds 8 columns' 4-bit values in the order [0, 2, 4, 6, 1, 3, 5, 7]
  from the low nibble up; ``w = (q - z) * s``.
- **GPTQ** (the ``AutoGPTQ``/``GPTQModel`` packing, vLLM's ``gptq.py``; ``bits`` 4 or 8):
  ``qweight`` int32 [K*bits/32, N] packed along K, the low bits first; ``qzeros`` int32
  [K/g, N*bits/32] packed along N the same way; ``scales`` [K/g, N]; ``g_idx`` int32 [K]
  the group of each input row (act-order/``desc_act``), else row ``k`` is in group
  ``k // g``. A group size of -1 is one group: ``scales`` has one row. The stored zero
  is ``z - 1`` in the format AutoGPTQ writes (``checkpoint_format`` ``"gptq"``, "v1"),
  ``z`` itself in GPTQModel's ``"gptq_v2"``; ``w = (q - z) * s`` in both.

``w`` is computed in fp32 and rounded to ``x``'s dtype before the product, which
accumulates in fp32. For a small M the K dimension is split over ``split_k`` programs
per output tile whose fp32 partial sums are added after the launch (deterministic, unlike
atomics), so that a decode step still fills the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K = 32
BLOCK_N = 64


@triton.jit
def w4a16_gemm_kernel(out_ptr, x_ptr, qweight_ptr, scales_ptr, qzeros_ptr, g_idx_ptr,
                      M, N, K, stride_x, stride_q, stride_s, stride_z, stride_out,
                      stride_split, group_size, k_per_split,
                      AWQ: tl.constexpr, BITS: tl.constexpr, ZERO_OFFSET: tl.constexpr,
                      HAS_G_IDX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(2) * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    n_ok = n[None, :] < N
    if AWQ:  # 8 columns a word, in the order [0, 2, 4, 6, 1, 3, 5, 7]
        column = n % 8
        q_shift = ((column % 2) * 4 + column // 2) * 4
        z_shift = q_shift
    else:
        z_shift = (n % PACK) * BITS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_end
        x = tl.load(x_ptr + m[:, None].to(tl.int64) * stride_x + k[None, :],
                    mask=(m[:, None] < M) & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & n_ok
        if AWQ:
            word = tl.load(qweight_ptr + k[:, None] * stride_q + (n // 8)[None, :],
                           mask=wmask, other=0)
            q = (word >> q_shift[None, :]) & MASK
        else:
            word = tl.load(qweight_ptr + (k // PACK)[:, None] * stride_q + n[None, :],
                           mask=wmask, other=0)
            q = (word >> ((k % PACK) * BITS)[:, None]) & MASK
        if HAS_G_IDX:
            group = tl.load(g_idx_ptr + k, mask=k_ok, other=0)
        else:
            group = k // group_size
        scale = tl.load(scales_ptr + group[:, None] * stride_s + n[None, :], mask=wmask,
                        other=0.0)
        zword = tl.load(qzeros_ptr + group[:, None] * stride_z + (n // PACK)[None, :],
                        mask=wmask, other=0)
        zero = ((zword >> z_shift[None, :]) & MASK) + ZERO_OFFSET
        w = ((q - zero).to(tl.float32) * scale.to(tl.float32)).to(x.dtype)
        acc += tl.dot(x, w, input_precision="ieee")  # fp32 x: no tf32
    tl.store(out_ptr + tl.program_id(2) * stride_split + m[:, None].to(tl.int64) * stride_out
             + n[None, :], acc.to(out_ptr.dtype.element_ty), mask=(m[:, None] < M) & n_ok)


def default_split_k(m: int, n: int, k: int) -> int:
    """Split K when few output tiles would keep the GPU busy: small M (decode) and a K
    long enough that each part still has several tiles to add up."""
    if m > 64 or triton.cdiv(n, BLOCK_N) >= 128:
        return 1
    return max(1, min(8, k // (4 * BLOCK_K)))


def _launch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
            qzeros: torch.Tensor, g_idx: torch.Tensor | None, *, awq: bool, bits: int,
            zero_offset: int, split_k: int | None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    m, k = rows.shape
    n = scales.shape[1]
    split = split_k or default_split_k(m, n, k)
    k_per_split = triton.cdiv(triton.cdiv(k, split), BLOCK_K) * BLOCK_K
    split = triton.cdiv(k, k_per_split)
    if split == 1:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    if m:
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, BLOCK_N), split)
        w4a16_gemm_kernel[grid](
            out, rows, qweight, scales, qzeros, qzeros if g_idx is None else g_idx,
            m, n, k, rows.stride(0), qweight.stride(0), scales.stride(0), qzeros.stride(0),
            n, m * n, k // scales.shape[0], k_per_split,
            AWQ=awq, BITS=bits, ZERO_OFFSET=zero_offset, HAS_G_IDX=g_idx is not None,
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    if split > 1:
        out = out.sum(0).to(x.dtype)
    return out.view(*x.shape[:-1], n)


def _expect(name: str, tensor: torch.Tensor, shape: tuple[int, ...], layout: str) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{layout}: {name} is {tuple(tensor.shape)}, expected {shape}")
    if tensor.stride(-1) != 1:
        raise ValueError(f"{layout}: {name} must be contiguous in its last dimension")


def _groups(k: int, scales: torch.Tensor, layout: str) -> int:
    groups = scales.shape[0]
    if groups == 0 or k % groups:
        raise ValueError(f"{layout}: scales has {groups} groups, which do not divide the "
                         f"{k} input features")
    return groups


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
             qzeros: torch.Tensor, split_k: int | None = None) -> torch.Tensor:
    """``x @ W`` for an AWQ GEMM-layout 4-bit weight (see the module docstring);
    ``x`` [..., K] fp16/bf16/fp32, the result in ``x``'s dtype."""
    k, n = x.shape[-1], scales.shape[1]
    groups = _groups(k, scales, "AWQ")
    _expect("qweight", qweight, (k, n // 8), "AWQ")
    _expect("qzeros", qzeros, (groups, n // 8), "AWQ")
    if n % 8 or qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError("AWQ: qweight and qzeros are int32 and the output features a "
                         f"multiple of 8 (got {n}, {qweight.dtype}, {qzeros.dtype})")
    return _launch(x, qweight, scales, qzeros, None, awq=True, bits=4, zero_offset=0,
                   split_k=split_k)


def gptq_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              qzeros: torch.Tensor, g_idx: torch.Tensor | None = None, bits: int = 4,
              checkpoint_format: str = "gptq", split_k: int | None = None) -> torch.Tensor:
    """``x @ W`` for a GPTQ weight of ``bits`` 4 or 8 (see the module docstring);
    ``checkpoint_format`` ``"gptq"`` (stored zeros are ``z - 1``) or ``"gptq_v2"``."""
    if bits not in (4, 8):
        raise ValueError(f"GPTQ: {bits}-bit weights are not supported (4 or 8)")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"GPTQ: unknown checkpoint_format {checkpoint_format!r} "
                         "(gptq or gptq_v2)")
    pack = 32 // bits
    k, n = x.shape[-1], scales.shape[1]
    groups = _groups(k, scales, "GPTQ")
    _expect("qweight", qweight, (k // pack, n), "GPTQ")
    _expect("qzeros", qzeros, (groups, n // pack), "GPTQ")
    if k % pack or n % pack or qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(f"GPTQ: qweight and qzeros are int32 and both dims multiples of "
                         f"{pack} (got K={k}, N={n}, {qweight.dtype}, {qzeros.dtype})")
    if g_idx is not None:
        _expect("g_idx", g_idx, (k,), "GPTQ")
        g_idx = g_idx.to(torch.int32)
    return _launch(x, qweight, scales, qzeros, g_idx, awq=False, bits=bits,
                   zero_offset=1 if checkpoint_format == "gptq" else 0, split_k=split_k)
