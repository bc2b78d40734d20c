"""SiLU-and-multiply of gated MLPs: ``silu(gate) * up`` for an input ``[..., 2 * d]`` that
holds gate and up side by side (the output of a fused gate/up projection).

Rounded to the model dtype where the portable ``SiluAndMul`` rounds (after the SiLU,
after the product), so both give the same values. A program takes a tile of ``ROWS``
rows by ``BLOCK`` columns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo_triton.tuning import active_tuning

MAX_BLOCK = 1024  # output columns per program


@triton.jit
def silu_and_mul_kernel(out_ptr, x_ptr, num_rows, stride_x, stride_out, D: tl.constexpr,
                        BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < num_rows) & (cols[None, :] < D)
    src = x_ptr + rows[:, None] * stride_x + cols[None, :]
    gate = tl.load(src, mask=mask, other=0.0)
    up = tl.load(src + D, mask=mask, other=0.0)
    gate32 = gate.to(tl.float32)
    silu = (gate32 / (1.0 + tl.exp(-gate32))).to(gate.dtype)
    out = silu.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2d] -> [..., d]``."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension, got {x.shape[-1]}")
    d = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    num_rows = rows.shape[0]
    out = torch.empty(num_rows, d, dtype=x.dtype, device=x.device)
    if num_rows:
        block = min(MAX_BLOCK, triton.next_power_of_2(d))
        per_program = active_tuning().rows_per_program(block)
        silu_and_mul_kernel[(triton.cdiv(num_rows, per_program), triton.cdiv(d, block))](
            out, rows, num_rows, rows.stride(0), out.stride(0), D=d, BLOCK=block,
            ROWS=per_program, num_warps=active_tuning().elementwise_warps)
    return out.view(*x.shape[:-1], d)
