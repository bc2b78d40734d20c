"""Dequantizers for the GGUF tensor types Octavo reads.

Each quantized type stores a tensor as fixed-size blocks of bytes (llama.cpp's
``ggml-quants.c`` layouts). A decoder turns all blocks of a tensor at once, with torch ops,
into floats; the arithmetic follows llama.cpp's reference order so results are bit-exact.
Float types (F32, F16, BF16) are only reinterpreted: they come back in the dtype they are stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as GgmlType

QK = 32  # elements per block of the legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
QK_K = 256  # elements per super-block of the k-quants (Q4_K, Q6_K)
CHUNK_BLOCKS = 1 << 16  # blocks decoded per step, to bound the temporaries of a large tensor


@dataclass(frozen=True)
class BlockFormat:
    """How one quantized type lays out a block: its size and how to decode many at once."""

    block_elems: int
    block_bytes: int
    decode: Callable[[torch.Tensor], torch.Tensor]  # (n, block_bytes) uint8 -> (n, block_elems) f32


def _fp16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 scalar at ``offset`` of every block, as an (n, 1) fp32 column."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes into 4-bit values: all low nibbles first, then all high nibbles."""
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)


def _decode_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_0: fp16 scale d, 32 x 4-bit q; x = (q - 8) * d."""
    d = _fp16(blocks, 0)
    return (_nibbles(blocks[:, 2:]).float() - 8) * d


def _decode_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_1: fp16 scale d and minimum m, 32 x 4-bit q; x = q * d + m."""
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)
    return _nibbles(blocks[:, 4:]).float() * d + m


def _fifth_bits(packed: torch.Tensor) -> torch.Tensor:
    """The 32 high (fifth) bits of a Q5 block, from its little-endian uint32 ``qh``, as 0/16:
    bit j belongs to element j."""
    bits = (packed.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1  # (n, 4, 8)
    return bits.reshape(packed.shape[0], QK) << 4


def _decode_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_0: fp16 scale d, 32 high bits, 32 x 4-bit low parts; x = (q - 16) * d."""
    d = _fp16(blocks, 0)
    return ((_nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])).float() - 16) * d


def _decode_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_1: fp16 scale d and minimum m, 32 high bits, 32 x 4-bit low parts; x = q * d + m."""
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)
    return (_nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])).float() * d + m


def _decode_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    """Q8_0: fp16 scale d, 32 x int8 q; x = q * d."""
    d = _fp16(blocks, 0)
    return blocks[:, 2:].contiguous().view(torch.int8).float() * d


def _k4_scales_and_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of a Q4_K super-block, packed into 12 bytes.

    Bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; scales/mins 4-7 take their low
    4 bits from bytes 8-11 and their top 2 bits from the spare top bits of bytes 0-7.
    """
    lo, hi, mixed = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([lo & 63, (mixed & 0x0F) | ((lo >> 6) << 4)], dim=-1)
    mins = torch.cat([hi & 63, (mixed >> 4) | ((hi >> 6) << 4)], dim=-1)
    return scales, mins


def _decode_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_K: 8 sub-blocks of 32; x = (d * scale) * q - (dmin * min).

    The 128 quant bytes form 4 runs of 32 bytes; each run holds sub-block 2i in its low
    nibbles and sub-block 2i+1 in its high nibbles.
    """
    n = blocks.shape[0]
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    scales, mins = _k4_scales_and_mins(blocks[:, 4:16])
    runs = blocks[:, 16:144].reshape(n, 4, 32)
    q = torch.stack([runs & 0x0F, runs >> 4], dim=2).reshape(n, 8, 32).float()
    sub_d = (d * scales.float()).unsqueeze(-1)
    sub_m = (dmin * mins.float()).unsqueeze(-1)
    return (sub_d * q - sub_m).reshape(n, QK_K)


def _decode_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """Q6_K: 16 sub-blocks of 16 with int8 scales; x = (d * scale) * (q - 32).

    Each half of 128 values takes its low 4 bits from 64 bytes of ``ql`` (low nibbles of bytes
    0-31, 32-63, then high nibbles of the same) and its top 2 bits from 32 bytes of ``qh``
    (bit pairs 0-1, 2-3, 4-5, 6-7 for the four runs of 32).
    """
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 32)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = _fp16(blocks, 208)
    low = _nibbles(ql)
    high = torch.cat([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=-1)
    q = (low | (high << 4)).float() - 32
    return ((d * scales).unsqueeze(-1) * q.reshape(n, 16, 16)).reshape(n, QK_K)


BLOCK_FORMATS: dict[GgmlType, BlockFormat] = {
    GgmlType.Q4_0: BlockFormat(QK, 2 + QK // 2, _decode_q4_0),
    GgmlType.Q4_1: BlockFormat(QK, 4 + QK // 2, _decode_q4_1),
    GgmlType.Q5_0: BlockFormat(QK, 2 + 4 + QK // 2, _decode_q5_0),
    GgmlType.Q5_1: BlockFormat(QK, 4 + 4 + QK // 2, _decode_q5_1),
    GgmlType.Q8_0: BlockFormat(QK, 2 + QK, _decode_q8_0),
    GgmlType.Q4_K: BlockFormat(QK_K, 4 + 12 + QK_K // 2, _decode_q4_k),
    GgmlType.Q6_K: BlockFormat(QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, _decode_q6_k),
}

FLOAT_TYPES: dict[GgmlType, torch.dtype] = {
    GgmlType.F32: torch.float32,
    GgmlType.F16: torch.float16,
    GgmlType.BF16: torch.bfloat16,
}

SUPPORTED_TYPES = frozenset(FLOAT_TYPES) | frozenset(BLOCK_FORMATS)


def dequantize(raw: np.ndarray, ggml_type: GgmlType, shape: tuple[int, ...]) -> torch.Tensor:
    """Turn the raw bytes of one GGUF tensor into a torch tensor of ``shape`` (row-major).

    ``raw`` is the tensor's data as stored (any numpy dtype; only its bytes are read).
    Float types keep their dtype; quantized types become fp32.
    """
    data = raw_bytes(raw)
    if ggml_type in FLOAT_TYPES:
        return data.view(FLOAT_TYPES[ggml_type]).reshape(shape)
    return dequantize_blocks(data, ggml_type, shape)


def raw_bytes(raw: np.ndarray) -> torch.Tensor:
    """A GGUF tensor's bytes as a flat uint8 tensor (a copy: the file's map stays read-only)."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(-1).copy())


def dequantize_blocks(data: torch.Tensor, ggml_type: int, shape: tuple[int, ...]
                      ) -> torch.Tensor:
    """The fp32 tensor of ``shape`` that the uint8 blocks ``data`` (any shape) of the block
    type ``ggml_type`` hold."""
    fmt = BLOCK_FORMATS.get(GgmlType(ggml_type))
    if fmt is None:
        raise ValueError(f"unsupported GGUF tensor type {GgmlType(ggml_type).name}")
    blocks = data.reshape(-1, fmt.block_bytes)
    out = torch.empty(blocks.shape[0], fmt.block_elems, dtype=torch.float32)
    for start in range(0, blocks.shape[0], CHUNK_BLOCKS):
        out[start : start + CHUNK_BLOCKS] = fmt.decode(blocks[start : start + CHUNK_BLOCKS])
    return out.reshape(shape)
