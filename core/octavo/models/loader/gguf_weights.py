"""The tensors of a GGUF file, renamed to Hugging Face parameters: 2-D weights of a block
type kept quantized (``GgufTensor``), every other tensor dequantized."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import torch
from gguf import ReaderTensor

from octavo.models.loader.dequant import BLOCK_FORMATS, dequantize, raw_bytes
from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.gguf_metadata import GgufFile
from octavo.models.loader.gguf_names import EXPERT
from octavo.models.loader.quantized import GgufTensor, Weight


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation.

    HF llama keeps each head's rotary pairs as (first half, second half); llama.cpp's converter
    interleaves them, viewing the rows of a head as (2, head_dim/2) and transposing. Transposing
    back restores HF's order. Works for weights and biases alike (rows are dim 0), and for
    quantized blocks ``[rows, bytes]``: rows move whole, the blocks inside a row stay.
    """
    rows = weight.shape[0]
    pairs = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return pairs.transpose(1, 2).reshape(weight.shape)


class GgufWeights:
    """Streams a GGUF's tensors as ``(hf_name, tensor)``; see ``ModelFiles.iter_weights``."""

    def __init__(
        self, gguf: GgufFile, tensors: dict[str, ReaderTensor], permuted_heads: dict[str, int],
        norm_shift: float = 0.0,
    ) -> None:
        self.gguf = gguf  # kept open: the tensors are views into its memory map
        self.tensors = tensors  # HF name -> GGUF tensor
        self.permuted_heads = permuted_heads  # HF name -> head count, for Q/K to unpermute
        # Subtracted (in fp32, as HF's GGUF loader does) from the norm weights: Gemma's 1 + w.
        self.norm_shift = norm_shift

    def __len__(self) -> int:
        """HF tensors yielded: a stacked expert tensor is one per expert (its slowest
        dimension, GGUF's last)."""
        return sum(int(tensor.shape[-1]) if EXPERT in name else 1
                   for name, tensor in self.tensors.items())

    def __iter__(self) -> Iterator[tuple[str, Weight]]:
        for name, tensor in self.tensors.items():
            # GGUF lists dimensions fastest-first; torch wants them slowest-first.
            shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
            if len(shape) == 2 and EXPERT not in name and tensor.tensor_type in BLOCK_FORMATS:
                yield name, self._blocks(name, tensor, (shape[0], shape[1]))
                continue
            weight = dequantize(tensor.data, tensor.tensor_type, shape)
            if name in self.permuted_heads:
                weight = unpermute_qk(weight, self.permuted_heads[name])
            if self.norm_shift and name.endswith("norm.weight"):
                weight = weight.float() - self.norm_shift
            if EXPERT in name:  # every expert's, stacked: HF names each expert's own
                for expert, part in enumerate(weight):
                    yield name.replace(EXPERT, str(expert)), part
            else:
                yield name, weight

    def _blocks(self, name: str, tensor: ReaderTensor, shape: tuple[int, int]) -> GgufTensor:
        """A quantized weight's blocks, one row of bytes per row (Q/K rows unpermuted)."""
        blocks = raw_bytes(tensor.data).reshape(shape[0], -1)
        if name in self.permuted_heads:
            blocks = unpermute_qk(blocks, self.permuted_heads[name]).contiguous()
        return GgufTensor(int(tensor.tensor_type), blocks, shape)

    def file_of(self, name: str) -> Path:
        stacked = re.sub(r"\.experts\.\d+\.", f".experts.{EXPERT}.", name)
        if name not in self.tensors and stacked not in self.tensors:
            raise ModelLoadError(f"{self.gguf.path}: holds no weight named {name!r}")
        return self.gguf.path
