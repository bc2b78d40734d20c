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

import ctypes
from collections.abc import Sequence

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


class LayerDelta:
    """``octavo.lora.ops.LayerDelta`` in one C call (``octavo_lora_delta``): the arguments
    that do not change between steps (the stacks' addresses, shapes, the slices' columns)
    are made here once, when the layer is wrapped, not in every call."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor,
                 slices: Sequence[tuple[int, int]]) -> None:
        lib = kernels.library()
        assert lib is not None
        self.function = lib.octavo_lora_delta
        self.stacks = (a, b)  # kept alive: the C call reads them by address
        self.dtype = a.dtype
        self.code = _DTYPES[a.dtype]
        self.a, self.b = a.data_ptr(), b.data_ptr()
        self.slices = (ctypes.c_int64 * (2 * len(slices)))(*(v for s in slices for v in s))
        self.num_slices = len(slices)
        _, self.num_slots, self.rank, self.in_features = a.shape
        self.out_features = b.shape[1]
        # The same operands for the fused decode layer (octavo_layer's *_lora), which adds
        # the delta inside its call (octavo.cpu.decode_layer).
        self.slots = kernels.LoRASlots(a=self.a, b=self.b, dtype=self.code,
                                       slices=ctypes.addressof(self.slices),
                                       num_slices=self.num_slices, num_slots=self.num_slots,
                                       rank=self.rank)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, groups: TokenGroups) -> bool:
        dtype = self.dtype
        if (x.dtype is not dtype or y.dtype is not dtype or not x.is_cpu or not y.is_cpu
                or x.stride(-1) != 1 or y.stride(-1) != 1):
            return False
        status = self.function(
            y.data_ptr(), y.stride(0), x.data_ptr(), x.stride(0), self.a, self.b, self.code,
            self.slices, self.num_slices, groups.sorted_tokens.data_ptr(),
            groups.starts.data_ptr(), groups.counts.data_ptr(), self.num_slots, x.shape[0],
            self.rank, self.in_features, self.out_features)
        kernels.check_status("octavo_lora_delta", status)
        return True


def bind_delta(a: torch.Tensor, b: torch.Tensor,
               slices: Sequence[tuple[int, int]]) -> LayerDelta | None:
    """``octavo.lora.ops.BindDelta``: a :class:`LayerDelta` for contiguous bf16 or fp32
    stacks on the CPU, None for others (they take the shrink/expand pair per slice)."""
    if (a.dtype not in _DTYPES or b.dtype is not a.dtype or not a.is_cpu or not b.is_cpu
            or not a.is_contiguous() or not b.is_contiguous()):
        return None
    return LayerDelta(a, b, slices)
