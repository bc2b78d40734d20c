"""``LoRALinearMethod``: any linear method (dense or quantized) plus the adapters' delta.

The wrapper keeps the base method (``base``) and, for each slice of the layer (one for
``o_proj``/``down_proj``, three for ``qkv_proj``, two for ``gate_up_proj``), a stack of
A and B over the adapter slots: ``a [slices, L, R, in]`` and ``b [L, out, R]`` (the
slices' rows back to back, as in the base weight), zero where a slot holds no adapter or
the adapter does not target the slice. The layer's output is the base product plus, for
the step's tokens with an adapter, ``(x A^T) B^T`` through the platform's shrink/expand
(``after_gemm``), whichever GEMM computed the base product: the base method's ``apply``, or
the platform's faster one where the base weight is dense (``dense`` is the base's: the CPU
gives a wrapped bf16 layer its prepacked GEMM and hands the product to ``after_gemm``).

Tensor parallelism shards the stacks the way the base layer is sharded, through the
layer's own weight loader: a column-parallel layer's B on its output rows (A whole), a
row-parallel layer's A on its input columns (B whole; the partial deltas are summed by
the layer's all-reduce with the base output).

``adds_after_gemm`` is True only in a step with an adapter: a platform's fused path that
never calls ``after_gemm`` (the CPU's fused decode stack) serves the steps without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from octavo.lora.adapter import LoRAAdapter, LoRAError
from octavo.lora.ops import (
    BindDelta,
    Expand,
    LayerDelta,
    Shrink,
    TokenGroups,
    group_tokens,
    lora_expand,
    lora_shrink,
)
from octavo.models.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from octavo.models.layers.quantization import LinearMethodBase
from octavo.models.layers.weights import copy_shard


@dataclass
class LoRABatch:
    """The step's token -> slot map (int32 ``[T]``, -1: no adapter) and its tokens grouped
    by slot (:meth:`set_map`), shared by every wrapped layer of the ``num_slots`` slots;
    both None when no token of the step has an adapter."""

    num_slots: int
    shrink: Shrink = lora_shrink
    expand: Expand = lora_expand
    bind: BindDelta | None = None
    token_lora: torch.Tensor | None = None
    groups: TokenGroups | None = None

    def set_map(self, token_lora: torch.Tensor | None) -> None:
        """The step's map (None: no adapter in the step), grouped here once for every
        layer's kernels."""
        self.token_lora = token_lora
        self.groups = None if token_lora is None else group_tokens(token_lora, self.num_slots)


@dataclass
class LoRASlice:
    """One HF projection inside a layer: its module name, its shard id in the layer's
    weight loader (None: the layer is that projection alone) and its local rows."""

    module: str
    shard_id: object
    size: int
    offset: int = field(default=0)


class LoRALinearMethod(LinearMethodBase):
    """``base`` with the adapter slots' delta added (see the module docstring)."""

    def __init__(self, base: LinearMethodBase, layer: LinearBase, slices: list[LoRASlice],
                 batch: LoRABatch, max_loras: int, max_rank: int, dtype: torch.dtype) -> None:
        self.base = base
        self.layer = layer
        self.slices = slices
        self.batch = batch
        self.max_rank = max_rank
        self.a = torch.zeros(len(slices), max_loras, max_rank, layer.in_features, dtype=dtype)
        self.b = torch.zeros(max_loras, layer.out_features, max_rank, dtype=dtype)
        # The platform's one-call delta over these stacks (None: shrink/expand per slice).
        self.delta: LayerDelta | None = (
            None if batch.bind is None
            else batch.bind(self.a, self.b, [(piece.offset, piece.size) for piece in slices]))

    @property
    def dense(self) -> bool:
        return self.base.dense

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.base.process_weights_after_loading(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._with_delta(x, self.base.apply(layer, x, bias))

    def after_gemm(self, layer: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._with_delta(x, self.base.after_gemm(layer, x, y))

    def _with_delta(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base layer's output) with the step's deltas added in place."""
        token_lora = self.batch.token_lora
        if token_lora is not None:
            self.add_delta(x, y, token_lora)
        return y

    def adds_after_gemm(self) -> bool:
        return self.batch.token_lora is not None or self.base.adds_after_gemm()

    def add_delta(self, x: torch.Tensor, y: torch.Tensor, token_lora: torch.Tensor) -> None:
        """``y += (x A_s^T) B_s^T`` per token's slot ``s``: in one call of the platform's
        delta where it takes ``x`` and ``y``, else slice by slice."""
        groups = self.batch.groups
        if self.delta is not None and groups is not None and self.delta(x, y, groups):
            return
        buf = torch.empty(x.shape[0], self.max_rank, dtype=torch.float32, device=x.device)
        for index, piece in enumerate(self.slices):
            self.batch.shrink(x, self.a[index], token_lora, buf, 1.0, groups)
            self.batch.expand(y, buf, self.b[:, piece.offset:piece.offset + piece.size],
                              token_lora, piece.offset, piece.size, groups)

    def set_slot(self, slot: int, adapter: LoRAAdapter | None) -> None:
        """Place ``adapter``'s weights for this layer in ``slot`` (zeros where it has none),
        this rank's shard of them; ``LoRAError`` if they do not fit the base layer."""
        self.a[:, slot].zero_()
        self.b[slot].zero_()
        if adapter is None:
            return
        for index, piece in enumerate(self.slices):
            weights = adapter.weights.get(piece.module)
            if weights is None:
                continue
            a = _pad(weights.a, 0, self.max_rank)
            b = _pad(weights.b, 1, self.max_rank)
            try:
                self._place(index, slot, piece, a, b)
            except ValueError as exc:
                raise LoRAError(f"LoRA adapter {adapter.path!r}: {piece.module} does not fit "
                                f"the base model ({exc})") from None

    def _place(self, index: int, slot: int, piece: LoRASlice, a: torch.Tensor,
               b: torch.Tensor) -> None:
        slot_a, slot_b = self.a[index, slot], self.b[slot]
        if isinstance(self.layer, RowParallelLinear):
            self.layer.weight_loader(slot_a, a)  # type: ignore[arg-type]  # A on its input
            copy_shard(slot_b, b)
        else:
            copy_shard(slot_a, a)
            self.layer.weight_loader(slot_b, b, piece.shard_id)  # type: ignore[arg-type]


def _pad(tensor: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``tensor`` zero-padded along ``dim`` to ``size`` (a rank below the slots' width)."""
    missing = size - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)


def layer_slices(layer: LinearBase, name: str,
                 stacked: tuple[tuple[str, str, object], ...]) -> list[LoRASlice]:
    """The HF projections of ``layer`` (named ``name`` in the model), from the model's
    ``stacked_params`` (fused name, HF name, shard id)."""
    dotted = f".{name.rsplit('.', 1)[-1]}."
    prefix = name.rsplit(".", 1)[0]
    parts = [(hf.strip("."), shard) for fused, hf, shard in stacked if fused == dotted]
    if not parts:
        return [LoRASlice(name, None, layer.out_features)]
    assert isinstance(layer, MergedColumnParallelLinear)
    sizes = layer.local_sizes
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return [LoRASlice(f"{prefix}.{hf}", shard, sizes[layer.shard_index(shard)],
                      offsets[layer.shard_index(shard)]) for hf, shard in parts]
