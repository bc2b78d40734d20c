"""Linear layers that know how tensor parallelism splits them.

A column-parallel layer keeps a slice of the output features on each rank, a row-parallel
layer a slice of the input features (its partial outputs are summed across ranks). Fused
layers (``MergedColumnParallelLinear`` for gate/up, ``QKVParallelLinear`` for q/k/v) hold
several HF projections in one weight so one matmul computes them; their weight loader
places each HF tensor in its shard. Built without an explicit ``tp_rank``/``tp_size``, a layer
takes this process's from the parallel state (``octavo.models.layers.parallel.resolve_tp``).

A layer's ``weight`` belongs to its quantization method (``quant_method``, from
``octavo.models.layers.quantization``): the method registers it, in whatever form it keeps
it, and multiplies with it; the layer's ``weight_loader`` places this rank's shard in it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from octavo.models.layers.parallel import all_reduce, check_divisible, kv_head_shards, resolve_tp
from octavo.models.layers.quantization import linear_method
from octavo.models.layers.weights import check_shape, copy_shard, new_parameter


class LinearBase(nn.Module):
    """``y = x W^T + b`` with this rank's ``weight [out, in]`` (as its ``quant_method``
    holds it) and an optional dense bias."""

    weight: nn.Parameter

    def __init__(
        self, in_features: int, out_features: int, bias: bool, tp_rank: int, tp_size: int
    ) -> None:
        super().__init__()
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.in_features = in_features  # this rank's
        self.out_features = out_features
        self.quant_method = linear_method(self)
        self.quant_method.create_weights(self, in_features, out_features, self.weight_loader)
        self.bias = new_parameter(out_features, weight_loader=self.weight_loader) if bias else None
        # A faster GEMM on a prepacked copy of the weight (or on its quantized blocks),
        # attached by the platform's prepare_model (the CPU's: octavo.cpu.gemm,
        # octavo.cpu.quant); None: the method's apply.
        self.cpu_gemm: Callable[[torch.Tensor], torch.Tensor] | None = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        raise NotImplementedError

    def reads_weight_with_cpu_gemm(self) -> bool:
        """Whether ``forward`` still reads ``weight`` itself once a ``cpu_gemm`` is attached
        (else a platform whose GEMM keeps its own copy may release it)."""
        return False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_gemm is not None:
            return self.quant_method.after_gemm(self, x, self.cpu_gemm(x))
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    """The whole layer on every rank (small layers such as an MoE router)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias, tp_rank=0, tp_size=1)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        copy_shard(param.data, loaded)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank's output is its slice (no communication)."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False,
        tp_rank: int | None = None, tp_size: int | None = None,
    ) -> None:
        tp_rank, tp_size = resolve_tp(tp_rank, tp_size)
        local = check_divisible("output features", output_size, tp_size)
        super().__init__(input_size, local, bias, tp_rank, tp_size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        copy_shard(param.data, loaded, 0, self.tp_rank, self.tp_size)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input stacked in one weight.

    ``shard_id`` (an index into ``output_sizes``) says which projection an HF tensor is;
    each rank stores its slice of every projection, back to back. Shard id None is a
    checkpoint that fused them already (Phi-3's ``gate_up_proj``, ``qkv_proj``): the
    projections stacked whole, which are split and loaded one by one.
    """

    def __init__(
        self, input_size: int, output_sizes: Sequence[int], bias: bool = False,
        tp_rank: int | None = None, tp_size: int | None = None,
    ) -> None:
        tp_rank, tp_size = resolve_tp(tp_rank, tp_size)
        self.output_sizes = list(output_sizes)
        self.local_sizes = self.split_sizes(output_sizes, tp_rank, tp_size)
        # LinearBase's, not ColumnParallelLinear's: the local rows are computed here.
        LinearBase.__init__(self, input_size, sum(self.local_sizes), bias, tp_rank, tp_size)

    def split_sizes(self, output_sizes: Sequence[int], tp_rank: int, tp_size: int) -> list[int]:
        """Each projection's rows on this rank."""
        return [check_divisible("output features", size, tp_size) for size in output_sizes]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is None:
            check_shape(loaded, (sum(self.output_sizes), *param.shape[1:]))
            for shard, part in zip(self.shard_ids(), loaded.split(self.output_sizes)):
                self.weight_loader(param, part, shard)
            return
        index = self.shard_index(shard_id)
        offset = sum(self.local_sizes[:index])
        dst = param.data.narrow(0, offset, self.local_sizes[index])
        copy_shard(dst, loaded, 0, *self.shard_of(index))

    def shard_of(self, index: int) -> tuple[int, int]:
        """(shard index, number of shards) of projection ``index`` on this rank."""
        del index
        return self.tp_rank, self.tp_size

    def shard_ids(self) -> list:
        """The shard ids of the projections, in their order in the weight."""
        return list(range(len(self.local_sizes)))

    def shard_index(self, shard_id) -> int:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.local_sizes):
            raise ValueError(f"shard id {shard_id!r} is not one of 0..{len(self.local_sizes) - 1}")
        return shard_id


class QKVParallelLinear(MergedColumnParallelLinear):
    """The q, k and v projections in one weight; shard ids ``"q"``, ``"k"``, ``"v"``.

    Ranks split the heads: each keeps ``num_heads / tp_size`` query heads and its share of
    the key/value heads, copies of one when there are fewer than ranks
    (:func:`~octavo.models.layers.parallel.kv_head_shards`).
    """

    SHARDS = ("q", "k", "v")

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
        bias: bool = False, tp_rank: int | None = None, tp_size: int | None = None,
    ) -> None:
        self.head_dim = head_dim
        self.total_heads = (num_heads, num_kv_heads)
        sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        super().__init__(hidden_size, sizes, bias, tp_rank, tp_size)

    def split_sizes(self, output_sizes: Sequence[int], tp_rank: int, tp_size: int) -> list[int]:
        del output_sizes  # the heads decide, not the rows
        num_heads, num_kv_heads = self.total_heads
        self.num_heads = check_divisible("attention heads", num_heads, tp_size)
        self.num_kv_heads, *self.kv_shard = kv_head_shards(num_kv_heads, tp_rank, tp_size)
        kv_size = self.num_kv_heads * self.head_dim
        return [self.num_heads * self.head_dim, kv_size, kv_size]

    def shard_of(self, index: int) -> tuple[int, int]:
        if index == 0:
            return self.tp_rank, self.tp_size
        return self.kv_shard[0], self.kv_shard[1]

    def shard_ids(self) -> list:
        return list(self.SHARDS)

    def shard_index(self, shard_id) -> int:
        if shard_id not in self.SHARDS:
            raise ValueError(f"shard id {shard_id!r} is not one of {self.SHARDS}")
        return self.SHARDS.index(shard_id)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; the partial outputs are summed (all-reduce).

    The bias is added once, after the reduction.
    """

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False,
        tp_rank: int | None = None, tp_size: int | None = None,
    ) -> None:
        tp_rank, tp_size = resolve_tp(tp_rank, tp_size)
        local = check_divisible("input features", input_size, tp_size)
        super().__init__(local, output_size, bias, tp_rank, tp_size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if param is self.bias:
            copy_shard(param.data, loaded)
        else:
            copy_shard(param.data, loaded, 1, self.tp_rank, self.tp_size)

    def reads_weight_with_cpu_gemm(self) -> bool:
        return self.tp_size > 1 and self.bias is not None

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's product of its slice of ``x``, before the ranks' all-reduce and the
        bias (what a mixture of experts sums over its experts and reduces once)."""
        # The platform's GEMM adds the bias, which must come once, after the reduction.
        gemm = self.cpu_gemm if self.bias is None else None
        return (self.quant_method.after_gemm(self, x, gemm(x)) if gemm is not None
                else self.quant_method.apply(self, x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return super().forward(x)
        output = all_reduce(self.partial(x))
        return output if self.bias is None else output + self.bias
