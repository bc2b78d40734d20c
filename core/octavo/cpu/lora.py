"""The CPU's LoRA shrink and expand (cpu_lora.c): ``octavo.lora.ops``'s contract in C.

Why: the portable kernels make a few PyTorch ops per adapter present (gather the slot's
rows, widen its A or B to fp32, multiply, scatter back, zero and add a dense delta) for each
of the 7 projections of each layer: W1 on 8 adapters spent ~250 ms of each step in them,
most of it in those ops' fixed costs and copies, not in the multiply-adds. These read x,
A, B and y in place (bf16 or fp32, as the model holds them: no per-step conversion), take
the step's tokens already grouped by slot (``TokenGroups``, made once per step by the model
runner) and do a projection's shrink or expand in one call.

Tensors these cannot take (other dtypes, strided rows) go to the portable kernels, which
compute the same thing.
"""

from __future__ import annotations

import torch

from octavo.cpu import kernels
from octavo.lora import ops
from octavo.lora.ops import TokenGroups, group_tokens

_DTYPES = {torch.bfloat16: kernels.HEADER.constants["OCTAVO_LORA_BF16"],
           torch.float32: kernels.HEADER.constants["OCTAVO_LORA_FP32"]}


def available() -> bool:
    """Whether the kernels' library is loaded here."""
    return kernels.library() is not None


def _takes(*tensors: torch.Tensor) -> bool:
    """Same dtype (bf16 or fp32), on the CPU, rows contiguous (the last stride 1)."""
    dtype = tensors[0].dtype
    return dtype in _DTYPES and all(t.dtype is dtype and t.is_cpu and t.stride(-1) == 1
                                    for t in tensors)


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, token_lora: torch.Tensor,
                out: torch.Tensor, scale: float, groups: TokenGroups | None = None) -> None:
    """``octavo.lora.ops.lora_shrink`` in one call (``lora_a [L, R, in]`` with contiguous
    slots, ``out [T, R]`` float32 with contiguous rows)."""
    if (not _takes(x, lora_a) or lora_a.stride(1) != lora_a.shape[2]
            or out.dtype != torch.float32 or out.stride(-1) != 1):
        ops.lora_shrink(x, lora_a, token_lora, out, scale, groups)
        return
    groups = groups or group_tokens(token_lora, lora_a.shape[0])
    lib = kernels.library()
    assert lib is not None
    status = lib.octavo_lora_shrink(
        out.data_ptr(), out.stride(0), x.data_ptr(), x.stride(0), lora_a.data_ptr(),
        lora_a.stride(0), _DTYPES[x.dtype], groups.sorted_tokens.data_ptr(),
        groups.starts.data_ptr(), groups.counts.data_ptr(), lora_a.shape[0], out.shape[0],
        lora_a.shape[1], lora_a.shape[2], scale)
    kernels.check_status("octavo_lora_shrink", status)


def lora_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor,
                token_lora: torch.Tensor, offset: int, size: int,
                groups: TokenGroups | None = None) -> None:
    """``octavo.lora.ops.lora_expand`` in one call (``lora_b [L, size, R]`` with rows of R
    contiguous values, as a slice of a layer's stacked B is)."""
    if (not _takes(y, lora_b) or lora_b.stride(1) != lora_b.shape[2]
            or buf.dtype != torch.float32 or buf.stride(-1) != 1):
        ops.lora_expand(y, buf, lora_b, token_lora, offset, size, groups)
        return
    groups = groups or group_tokens(token_lora, lora_b.shape[0])
    lib = kernels.library()
    assert lib is not None
    status = lib.octavo_lora_expand(
        y.narrow(1, offset, size).data_ptr(), y.stride(0), buf.data_ptr(), buf.stride(0),
        lora_b.data_ptr(), lora_b.stride(0), _DTYPES[y.dtype],
        groups.sorted_tokens.data_ptr(), groups.starts.data_ptr(), groups.counts.data_ptr(),
        lora_b.shape[0], lora_b.shape[2], size)
    kernels.check_status("octavo_lora_expand", status)
