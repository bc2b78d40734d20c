"""RMSNorm, optionally fused with the residual add before it (one read of each input).

The arithmetic follows ``octavo.models.layers.norm.RMSNorm`` step by step, including its
roundings to the model dtype (the sum, the normalised value, the product with the
weight), so the kernel reproduces the portable layer rather than a slightly different
norm. A program normalises ``ROWS`` rows: one for large hidden sizes, several for small
ones, so that each program has a few thousand elements to work on.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo_triton.tuning import active_tuning


@triton.jit
def rms_norm_kernel(
    out_ptr, residual_out_ptr,  # [rows, hidden]; residual_out only with HAS_RESIDUAL
    x_ptr, residual_ptr, weight_ptr,
    num_rows, stride_x, stride_residual, stride_out, eps,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < num_rows) & (cols[None, :] < HIDDEN)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + rows[:, None] * stride_residual + cols[None, :],
                           mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(dtype)
        tl.store(residual_out_ptr + rows[:, None] * HIDDEN + cols[None, :], x, mask=mask)
    x32 = x.to(tl.float32)
    mean_square = tl.sum(x32 * x32, 1) / HIDDEN
    normed = (x32 * tl.rsqrt(mean_square + eps)[:, None]).to(dtype)
    weight = tl.load(weight_ptr + cols, mask=cols < HIDDEN, other=0.0)
    out = weight.to(tl.float32)[None, :] * normed.to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``weight * x / rms(x)``; with ``residual``, first ``x = x + residual`` and return
    ``(normed, x)`` - the next residual - as ``RMSNorm.forward`` does."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight {tuple(weight.shape)} does not match hidden size {hidden}")
    rows = x.reshape(-1, hidden)
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
    residual_out = torch.empty_like(rows) if residual is not None else out
    residual_rows = residual.reshape(-1, hidden) if residual is not None else rows
    num_rows = rows.shape[0]
    if num_rows:
        block = triton.next_power_of_2(hidden)
        per_program = active_tuning().rows_per_program(block)
        rms_norm_kernel[(triton.cdiv(num_rows, per_program),)](
            out, residual_out, rows, residual_rows, weight,
            num_rows, rows.stride(0), residual_rows.stride(0), out.stride(0), eps,
            HIDDEN=hidden, BLOCK=block, ROWS=per_program, HAS_RESIDUAL=residual is not None,
            num_warps=active_tuning().elementwise_warps,
        )
    out = out.view(x.shape)
    if residual is None:
        return out
    return out, residual_out.view(x.shape)
