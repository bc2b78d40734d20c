"""Linear methods for quantized safetensors checkpoints: integer weights (AWQ, GPTQ,
compressed-tensors W4A16 and W8A8) and fp8 weights.

A layer registers the checkpoint's own tensors under their names (``qweight``, ``scales``,
...), each with a loader that unpacks it into rows-are-outputs form and hands it to the
layer's tensor-parallel loader, so fused projections and sharding work as for dense weights.
Scales of groups that a row-parallel split does not follow (act-order, or one group per
row) are replicated on every rank instead; a split that cuts a group is refused with the
numbers. Once loaded, an integer weight becomes GGUF blocks where it can
(``octavo.models.layers.int_weights``): the portable ``apply`` dequantizes them, the CPU
multiplies them with its GGUF kernels (``octavo.cpu.quant``). A layer's tensors are all
checked as they load, so a checkpoint that disagrees with its config fails before any
layer is converted.

Activations are not quantized: W8A8's per-token int8 activations and fp8's activation
scales are read (and checked) but the portable path multiplies in the model's dtype, as
vLLM's weight-only (Marlin) kernels do on GPUs without int8/fp8 compute; the CPU's Q8_0
VNNI kernel quantizes activations per 32 values, finer than per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.layers.checkpoint_formats import FLOATS, Dims, IntScheme, Role, expect
from octavo.models.layers.gguf import GgufMethod
from octavo.models.layers.int_weights import IntWeight, to_blocks
from octavo.models.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from octavo.models.layers.quantization import LinearMethodBase, WeightLoader, layer_weight

FP8_E4M3 = torch.float8_e4m3fn


def row_split(layer: LinearBase) -> int:
    """How many ranks split the layer's input features (1: not split)."""
    return layer.tp_size if isinstance(layer, RowParallelLinear) else 1


def full_rows(layer: LinearBase, shard_id: object) -> int:
    """The output features of the whole checkpoint tensor that loads as ``shard_id``."""
    if isinstance(layer, MergedColumnParallelLinear):
        if shard_id is None:
            return sum(layer.output_sizes)
        index = layer.shard_index(shard_id)
        return layer.local_sizes[index] * layer.shard_of(index)[1]
    return layer.out_features * (1 if isinstance(layer, RowParallelLinear) else layer.tp_size)


def frozen(tensor: torch.Tensor, loader: WeightLoader) -> nn.Parameter:
    param = nn.Parameter(tensor, requires_grad=False)
    param.weight_loader = loader  # type: ignore[attr-defined]
    return param


class IntLinearMethod(GgufMethod, LinearMethodBase):
    """Integer weights with group scales and zero points (see the module docstring)."""

    def __init__(self, scheme: IntScheme) -> None:
        super().__init__()
        self.scheme = scheme
        self.perm: torch.Tensor | None = None  # columns of the weight's blocks
        self.unblocked: IntWeight | None = None  # a weight not whole blocks: dequantized
        self.g_idx_loaded = False

    @property
    def dense(self) -> bool:
        return False

    def create_weights(self, layer, in_features: int, out_features: int,
                       weight_loader: WeightLoader) -> None:
        split = row_split(layer)
        cols = in_features * split
        group = cols if self.scheme.group_size == -1 else self.scheme.group_size
        if cols % group:
            raise ValueError(f"group size {group} does not divide the {cols} input features")
        self.replicated = split > 1 and (self.scheme.act_order or group == cols)
        if split > 1 and not self.replicated and in_features % group:
            raise ValueError(f"splitting {cols} input features over {split} tensor-parallel "
                             f"ranks gives {in_features} each, which cuts groups of {group}")
        self.group, self.groups = group, cols // group
        local_groups = self.groups if self.replicated or split == 1 else in_features // group
        shapes = {Role.Q: ((out_features, in_features), torch.int16),
                  Role.SCALES: ((out_features, local_groups), torch.float32),
                  Role.ZEROS: ((out_features, local_groups), torch.float32),
                  Role.G_IDX: ((in_features,), torch.int64), Role.SHAPE: ((0,), torch.int64),
                  Role.IGNORED: ((), torch.float32)}
        self.names = self.scheme.tensors
        for name, role in self.names.items():
            shape, dtype = shapes[role]
            loader = self._loader(layer, role, cols, weight_loader)
            layer.register_parameter(name, frozen(torch.zeros(shape, dtype=dtype), loader))

    def _loader(self, layer: LinearBase, role: Role, cols: int,
                weight_loader: WeightLoader) -> WeightLoader:
        def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
            dims = Dims(full_rows(layer, shard_id), cols, self.groups)
            if role is Role.IGNORED:
                load_input_scale(param, loaded)
            elif role is Role.G_IDX:
                self._load_g_idx(layer, param, loaded, dims)
            elif role is Role.SHAPE:
                expect(loaded, (2,), (torch.int32, torch.int64), "weight_shape")
                if loaded.tolist() != [dims.rows, dims.cols]:
                    raise ValueError(f"weight_shape says {loaded.tolist()}, the model "
                                     f"expects {[dims.rows, dims.cols]}")
            else:
                tensor = self.scheme.convert(role, loaded, dims)
                if role is not Role.Q and self.replicated:
                    tensor = tensor.repeat(1, row_split(layer))
                weight_loader(param, tensor, shard_id)
        return load

    def _load_g_idx(self, layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor,
                    dims: Dims) -> None:
        expect(loaded, (dims.cols,), (torch.int32, torch.int64), "g_idx")
        if loaded.numel() and (int(loaded.min()) < 0 or int(loaded.max()) >= dims.groups):
            raise ValueError(f"g_idx holds group {int(loaded.max())} or {int(loaded.min())}, "
                             f"outside the {dims.groups} groups of the config")
        local = loaded.to(torch.int64).narrow(0, layer.tp_rank * param.shape[0],
                                              param.shape[0]) if row_split(layer) > 1 else loaded
        if self.g_idx_loaded and not torch.equal(param.data, local.to(torch.int64)):
            raise ValueError("g_idx differs from that of the projections fused with it "
                             "(one input permutation serves them all)")
        param.data.copy_(local)
        self.g_idx_loaded = True

    def process_weights_after_loading(self, layer) -> None:
        weight = self._int_weight(layer)
        for name in self.names:
            delattr(layer, name)
        form = to_blocks(weight, self.scheme.bits)
        if form is None:
            self.unblocked = weight
            layer.weight = frozen(weight.q, self.weight.load)
            return
        layer.weight = frozen(form.blocks, self.weight.load)
        self.weight.ggml_type = form.ggml_type
        self.weight.rows, self.weight.cols = weight.q.shape
        self.weight.dtype = torch.get_default_dtype()
        self.perm = form.perm

    def _int_weight(self, layer: nn.Module) -> IntWeight:
        by_role = {role: getattr(layer, name).data for name, role in self.names.items()}
        q, scales = by_role[Role.Q], by_role[Role.SCALES]
        zeros = by_role.get(Role.ZEROS)
        if zeros is None:
            zeros = torch.full_like(scales, float(self.scheme.implicit_zero))
        if self.scheme.act_order:
            groups = by_role[Role.G_IDX]
        elif scales.shape[1] == 1:
            groups = torch.zeros(q.shape[1], dtype=torch.int64)
        else:
            groups = torch.arange(q.shape[1]) // self.group
        return IntWeight(q, scales, zeros, groups)

    def input_perm(self, layer: nn.Module) -> torch.Tensor | None:
        del layer
        return self.perm

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.unblocked is not None:
            return F.linear(x, self.unblocked.dequantize(x.dtype), bias)
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        return F.linear(x, self.weight.dequantized(layer_weight(layer), x.dtype), bias)


class Fp8LinearMethod(LinearMethodBase):
    """fp8 e4m3 weights with a scale per tensor or per output row (vLLM's ``fp8``:
    AutoFP8 / llm-compressor checkpoints, ``vllm/model_executor/layers/quantization/fp8.py``;
    compressed-tensors' float-quantized format): ``weight`` float8_e4m3fn ``[out, in]``,
    ``weight_scale`` a scalar or ``[out, 1]``, ``input_scale`` a scalar where the activation
    scheme is static. The apply dequantizes the weight to the activations' dtype and
    multiplies (no fp8 CPU kernel yet)."""

    def __init__(self, static_activations: bool) -> None:
        self.static_activations = static_activations

    @property
    def dense(self) -> bool:
        return False

    def create_weights(self, layer, in_features: int, out_features: int,
                       weight_loader: WeightLoader) -> None:
        def load_weight(param: nn.Parameter, loaded: torch.Tensor,
                        shard_id: object = None) -> None:
            expect(loaded, (full_rows(layer, shard_id), in_features * row_split(layer)),
                   (FP8_E4M3,), "fp8 weight")
            weight_loader(param, loaded, shard_id)

        def load_scale(param: nn.Parameter, loaded: torch.Tensor,
                       shard_id: object = None) -> None:
            rows = full_rows(layer, shard_id)
            if loaded.numel() == 1:
                loaded = loaded.reshape(1, 1).expand(rows, 1)
            expect(loaded.reshape(rows, -1) if loaded.numel() == rows else loaded,
                   (rows, 1), FLOATS, "fp8 weight_scale")
            if row_split(layer) > 1:  # a scale per output row: every rank needs them all
                param.data.copy_(loaded.reshape(rows, 1))
                return
            weight_loader(param, loaded.reshape(rows, 1).float(), shard_id)

        layer.weight = frozen(torch.zeros(out_features, in_features, dtype=FP8_E4M3),
                              load_weight)
        layer.weight_scale = frozen(torch.zeros(out_features, 1), load_scale)
        if self.static_activations:
            layer.input_scale = frozen(torch.zeros(()), load_input_scale)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        weight = layer_weight(layer).to(torch.float32) * layer.weight_scale
        return F.linear(x, weight.to(x.dtype), bias)


def load_input_scale(param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: object = None) -> None:
    """A static activation scale (one per fused projection: the largest is kept, as vLLM
    does); read and checked, not applied (see the module docstring)."""
    del shard_id
    if loaded.numel() != 1 or loaded.dtype not in FLOATS:
        raise ValueError(f"input_scale: expected one float, the checkpoint has "
                         f"{list(loaded.shape)} {loaded.dtype}")
    param.data = torch.maximum(param.data, loaded.reshape(()).float())
