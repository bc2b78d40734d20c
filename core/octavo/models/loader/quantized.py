"""``GgufTensor``: a GGUF weight kept in its quantized blocks, as the loader hands it on.

A 2-D weight of a block type (Q4_1, Q8_0, Q4_K, ...) is not dequantized at load: its bytes
go to the layer as ``blocks``, one row of the weight per row of bytes (its blocks in file
order), and the layer's quantization method keeps them (``octavo.models.layers.gguf``).
A layer that keeps dense weights calls :meth:`GgufTensor.dequantize` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.models.loader.dequant import BLOCK_FORMATS, BlockFormat, GgmlType, dequantize_blocks


@dataclass(frozen=True)
class GgufTensor:
    """``shape = (rows, cols)`` weights of ``ggml_type`` stored as ``blocks``: uint8
    ``[rows, cols // block_elems * block_bytes]``."""

    ggml_type: int
    blocks: torch.Tensor
    shape: tuple[int, int]

    @property
    def format(self) -> BlockFormat:
        return BLOCK_FORMATS[GgmlType(self.ggml_type)]

    def dequantize(self) -> torch.Tensor:
        """The fp32 ``[rows, cols]`` weight (exactly what the dense loader yields)."""
        return dequantize_blocks(self.blocks, self.ggml_type, self.shape)


def row_bytes(ggml_type: int, cols: int) -> int:
    """Bytes of one row of ``cols`` values of ``ggml_type``; ``ValueError`` naming the
    numbers where ``cols`` is not whole blocks."""
    fmt = BLOCK_FORMATS[GgmlType(ggml_type)]
    if cols % fmt.block_elems:
        raise ValueError(f"{cols} input features are not whole {GgmlType(ggml_type).name} "
                         f"blocks of {fmt.block_elems}")
    return cols // fmt.block_elems * fmt.block_bytes


Weight = torch.Tensor | GgufTensor  # what a weight stream yields for one name
