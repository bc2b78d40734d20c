"""The ``gguf`` quantization: layers that keep a GGUF's weights in their quantized blocks.

A linear layer's (or embedding's) ``weight`` holds the blocks as the file has them: uint8
``[rows, bytes per row]``, each row the GGUF blocks of one output feature (or vocabulary
row). Tensor parallelism splits it like a dense weight: rows for a column-parallel layer
and the vocabulary, whole blocks of each row for a row-parallel one (an input split that is
not whole blocks is refused, naming the numbers). The type is the first loaded tensor's;
a layer whose tensors come in several types (Q4_K_M's q/k in Q4_K, v in Q6_K, fused into one
qkv) or as floats keeps dense weights instead, in the model's dtype.

The portable ``apply`` dequantizes the blocks with the loader's torch decoders and calls
``F.linear``: correct everywhere, not fast. A platform with kernels for the type multiplies
the blocks itself (``quantized_weight`` hands them over; the CPU's: ``octavo.cpu.quant``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.layers.linear import RowParallelLinear
from octavo.models.layers.quantization import (
    EmbeddingMethodBase,
    LinearMethodBase,
    QuantizationConfig,
    WeightLoader,
    layer_weight,
    register_quantization_config,
)
from octavo.models.loader.dequant import dequantize_blocks
from octavo.models.loader.quantized import GgufTensor, row_bytes


@dataclass(frozen=True)
class QuantizedWeight:
    """A layer's weight as GGUF blocks: ``blocks`` uint8 ``[rows, cols / block_elems *
    block_bytes]`` of ``ggml_type`` for a ``[rows, cols]`` weight."""

    ggml_type: int
    blocks: torch.Tensor
    rows: int
    cols: int

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_blocks(self.blocks, self.ggml_type, (self.rows, self.cols)).to(dtype)


class GgufWeight:
    """The part both GGUF methods share: the layer's weight, blocks of one type or dense."""

    def __init__(self) -> None:
        self.ggml_type: int | None = None  # None: dense (or nothing loaded yet)
        self.rows = self.cols = 0
        self.dtype = torch.float32
        self.split = ""  # how tensor parallelism split the columns, for errors

    def create(self, layer: nn.Module, rows: int, cols: int, weight_loader: WeightLoader,
               split: str = "") -> None:
        """An empty ``layer.weight``, given its form by the first tensor loaded into it."""
        self.rows, self.cols, self.dtype, self.split = rows, cols, torch.get_default_dtype(), split
        self.layer_loader = weight_loader
        weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        weight.weight_loader = self.load  # type: ignore[attr-defined]
        weight.takes_gguf = True  # type: ignore[attr-defined]  # GgufTensor as is
        layer.weight = weight

    @property
    def dense(self) -> bool:
        return self.ggml_type is None

    def load(self, param: nn.Parameter, loaded: torch.Tensor | GgufTensor,
             shard_id: object = None) -> None:
        if isinstance(loaded, GgufTensor) and param.numel() == 0:
            try:
                per_row = row_bytes(loaded.ggml_type, self.cols)
            except ValueError as exc:
                raise ValueError(f"{exc}{self.split}") from None
            self.ggml_type = loaded.ggml_type
            param.data = torch.zeros(self.rows, per_row, dtype=torch.uint8)
        if isinstance(loaded, GgufTensor) and loaded.ggml_type == self.ggml_type:
            self.layer_loader(param, loaded.blocks, shard_id)
            return
        self._make_dense(param)
        self.layer_loader(param, loaded.dequantize() if isinstance(loaded, GgufTensor)
                          else loaded, shard_id)

    def _make_dense(self, param: nn.Parameter) -> None:
        """Turn the weight dense (the shards loaded so far dequantized)."""
        if self.ggml_type is None and param.numel():
            return
        quantized = self.quantized(param)
        param.data = (torch.zeros(self.rows, self.cols, dtype=self.dtype) if quantized is None
                      else quantized.dequantize(self.dtype))
        self.ggml_type = None

    def quantized(self, param: torch.Tensor) -> QuantizedWeight | None:
        if self.ggml_type is None:
            return None
        return QuantizedWeight(self.ggml_type, param.data, self.rows, self.cols)

    def dequantized(self, param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype``: dequantized from its blocks (every call), or as it is."""
        quantized = self.quantized(param)
        return param if quantized is None else quantized.dequantize(dtype)


class GgufMethod:
    """What the linear and embedding methods share: the weight, and its blocks for a
    platform's kernels."""

    def __init__(self) -> None:
        self.weight = GgufWeight()

    @property
    def dense(self) -> bool:
        return self.weight.dense

    def quantized_weight(self, layer: nn.Module) -> QuantizedWeight | None:
        """The layer's blocks for a platform's kernels; None where it keeps dense weights."""
        return self.weight.quantized(layer_weight(layer))

    def input_perm(self, layer: nn.Module) -> torch.Tensor | None:
        """The order the blocks take the input features in (None: as given): a kernel
        multiplies ``x[..., perm]`` with them (GPTQ act-order repacked into blocks)."""
        del layer
        return None


class GgufLinearMethod(GgufMethod, LinearMethodBase):
    """A linear layer on GGUF blocks (see the module's docstring)."""

    def create_weights(self, layer, in_features: int, out_features: int,
                       weight_loader: WeightLoader) -> None:
        split = ("" if not isinstance(layer, RowParallelLinear) or layer.tp_size == 1
                 else f" (this rank's share of {in_features * layer.tp_size} input features "
                      f"split over {layer.tp_size} tensor-parallel ranks)")
        self.weight.create(layer, out_features, in_features, weight_loader, split)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight.dequantized(layer_weight(layer), x.dtype), bias)


class GgufEmbeddingMethod(GgufMethod, EmbeddingMethodBase):
    """An embedding table (and the LM head that shares or owns one) on GGUF blocks: a
    lookup dequantizes only the rows it gathers."""

    def create_weights(self, layer, rows: int, hidden: int,
                       weight_loader: WeightLoader) -> None:
        self.weight.create(layer, rows, hidden, weight_loader)

    def embed(self, layer, ids: torch.Tensor) -> torch.Tensor:
        quantized = self.weight.quantized(layer_weight(layer))
        if quantized is None:
            return F.embedding(ids, layer_weight(layer))
        rows = QuantizedWeight(quantized.ggml_type, quantized.blocks[ids.reshape(-1)],
                               ids.numel(), quantized.cols)
        return rows.dequantize(self.weight.dtype).view(*ids.shape, quantized.cols)

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.dequantized(layer_weight(layer), x.dtype))

    def dense_weight(self, layer) -> torch.Tensor:
        return self.weight.dequantized(layer_weight(layer), self.weight.dtype)


@register_quantization_config
class GgufConfig(QuantizationConfig):
    """Every linear layer, embedding and LM head on GGUF blocks."""

    name = "gguf"

    def get_linear_method(self, layer) -> LinearMethodBase:
        return GgufLinearMethod()

    def get_embedding_method(self, layer) -> EmbeddingMethodBase:
        return GgufEmbeddingMethod()
