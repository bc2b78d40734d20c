"""Integer weights with per-group scales and zero points (AWQ, GPTQ, compressed-tensors), and
their repacking into GGUF blocks.

Every such format stores, for a ``[out, in]`` weight, integers ``q``, and per output row and
group of input columns a scale ``s`` and a zero point ``z``: ``w = (q - z) * s``. The loaders
(``octavo.models.layers.checkpoint_formats``) unpack each format's tensors into one form,
:class:`IntWeight`: ``q`` int16 ``[out, in]``, ``scales`` and ``zeros`` fp32 ``[out,
groups]``, and the group of each input column (``groups``; GPTQ's ``g_idx`` under act-order).

Why GGUF blocks: the CPU already has fast kernels for GGUF's Q4_1 (``w = q * d + m`` per 32
values, fp16 ``d`` and ``m``) and Q8_0 (``w = q * d``, int8 ``q``; the VNNI kernel).
A 4-bit group of 32, 64 or 128 columns is whole Q4_1 blocks with ``d = s`` and ``m = -z * s``;
an 8-bit symmetric one Q8_0 blocks with ``q - z`` and ``d = s``. Act-order (columns of a group
scattered) becomes whole blocks once the columns are sorted by group: the layer permutes the
weight's columns once here and the activations' on every call (:attr:`BlockForm.perm`).
The precision cost: ``d`` and ``m`` are rounded to fp16 - ``s`` is already fp16 in AWQ and
GPTQ (exact), ``m = -z * s`` moves by at most ``|z * s| * 2^-11`` (at most 1/128 of a
quantization step for 4-bit), a bf16 or fp32 scale (compressed-tensors) by 2^-11 of itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.models.loader.dequant import GgmlType

BLOCK = 32  # values per Q4_1 / Q8_0 block


@dataclass(frozen=True)
class IntWeight:
    """``w[o, i] = (q[o, i] - zeros[o, groups[i]]) * scales[o, groups[i]]``."""

    q: torch.Tensor  # int16 [out, in]
    scales: torch.Tensor  # fp32 [out, num_groups]
    zeros: torch.Tensor  # fp32 [out, num_groups]
    groups: torch.Tensor  # int64 [in]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The dense ``[out, in]`` weight in ``dtype`` (computed in fp32)."""
        zeros = self.zeros[:, self.groups]
        scales = self.scales[:, self.groups]
        return ((self.q.to(torch.float32) - zeros) * scales).to(dtype)


@dataclass(frozen=True)
class BlockForm:
    """An :class:`IntWeight` as GGUF blocks: ``blocks`` uint8 ``[out, row bytes]`` of
    ``ggml_type`` for the weight with its columns in the order ``perm`` (None: as is)."""

    ggml_type: int
    blocks: torch.Tensor
    perm: torch.Tensor | None


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The ``32 // bits`` unsigned fields of each int32 of ``packed``, lowest bits first,
    spread along ``dim`` (whose size grows that many times): int16."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    moved = packed.to(torch.int32).movedim(dim, -1)
    fields = (moved.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    fields = fields.reshape(*moved.shape[:-1], moved.shape[-1] * per_word)
    return fields.movedim(-1, dim).to(torch.int16).contiguous()


def to_blocks(weight: IntWeight, bits: int) -> BlockForm | None:
    """``weight`` as Q4_1 (4-bit) or Q8_0 (8-bit, every ``q - z`` an int8) blocks, or None
    where it is not whole blocks of one group each (or 8-bit values outside int8)."""
    in_features = weight.q.shape[1]
    if in_features % BLOCK:
        return None
    perm = torch.argsort(weight.groups, stable=True)
    block_groups = weight.groups[perm].view(-1, BLOCK)
    if not bool((block_groups == block_groups[:, :1]).all()):
        return None
    groups = block_groups[:, 0]
    identity = bool((perm == torch.arange(in_features)).all())
    q = (weight.q if identity else weight.q[:, perm]).view(weight.q.shape[0], -1, BLOCK)
    scales, zeros = weight.scales[:, groups], weight.zeros[:, groups]
    if bits == 4:
        blocks = _q4_1(q, scales, zeros)
        ggml_type = GgmlType.Q4_1
    else:
        signed = q.to(torch.float32) - zeros.unsqueeze(-1)
        if bool(((signed < -128) | (signed > 127) | (signed != signed.round())).any()):
            return None
        blocks = _q8_0(signed.to(torch.int8), scales)
        ggml_type = GgmlType.Q8_0
    return BlockForm(int(ggml_type), blocks.reshape(q.shape[0], -1).contiguous(),
                     None if identity else perm)


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """fp16 ``values [out, blocks]`` as their bytes ``[out, blocks, 2]``."""
    return values.to(torch.float16).contiguous().view(torch.uint8).view(*values.shape, 2)


def _q4_1(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks (ggml's ``block_q4_1``: fp16 d, fp16 m, 16 bytes holding values j and
    j + 16 in the low and high nibble of byte j) of ``q [out, blocks, 32]`` in 0..15."""
    nibbles = q.to(torch.uint8)
    packed = nibbles[..., :16] | (nibbles[..., 16:] << 4)
    return torch.cat([_half_bytes(scales), _half_bytes(-zeros * scales), packed], dim=-1)


def _q8_0(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks (ggml's ``block_q8_0``: fp16 d, 32 int8) of int8 ``q [out, blocks, 32]``."""
    return torch.cat([_half_bytes(scales), q.view(torch.uint8)], dim=-1)
