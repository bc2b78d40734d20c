"""Mixture-of-experts feed-forward: a top-k router and experts stored as stacked tensors.

All of a rank's experts live in two tensors, ``w13 [E_local, 2 * I_local, H]`` (gate and up,
i.e. HF's ``w1`` and ``w3``, stacked along the output) and ``w2 [E_local, H, I_local]``
(down). The tensor group shares the work in one of two ways:

- tensor parallelism (the default): every rank holds every expert, a ``1 / tp_size`` slice
  of its intermediate dim (``I_local = I / tp_size``);
- expert parallelism (``enable_expert_parallel``): rank ``r`` holds the whole experts
  ``[r * E / tp_size, (r + 1) * E / tp_size)`` (``E_local = E / tp_size``).

Either way a rank computes a partial sum of the output for every token, and the partials
are all-reduced. With data-parallel engines (``-dp N --enable-expert-parallel``) the
experts are spread over every worker of every engine instead, and tokens travel to them
by all-to-all (``octavo.models.layers.expert_dispatch``).

Inside one engine, expert parallelism needs no token dispatch: after attention's
all-reduce every tensor rank holds every token, so each rank runs its local experts on the
tokens routed to them and the combine is an all-reduce of the partial sums, the simplest
form of the all-gather/reduce-scatter family (correct because every rank sees every token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.state import get_parallel_state
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.expert_dispatch import dispatch_and_combine, token_share
from octavo.models.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from octavo.models.layers.parallel import all_reduce, check_divisible, resolve_tp
from octavo.models.layers.quantization import experts_quantized
from octavo.models.layers.weights import copy_shard, new_parameter

ExpertKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, nn.Module],
                        torch.Tensor]


@dataclass(frozen=True)
class Routing:
    """How a router's scores become each token's experts and weights."""

    top_k: int
    renormalize: bool = True  # divide the top-k weights by their sum (Mixtral, norm_topk_prob)
    # Group-limited top-k (DeepSeek-V2): the experts form num_groups equal groups; a token
    # picks its top_k among the topk_groups groups whose best expert scores highest.
    num_groups: int = 1
    topk_groups: int = 1
    scaling: float = 1.0  # the weights' factor (DeepSeek's routed_scaling_factor)


def select_experts(router_logits: torch.Tensor, routing: Routing | int,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts (fp32), keep the top ``k`` (within the best groups where
    ``routing`` has groups), renormalise and scale as ``routing`` says; an int is Mixtral's
    routing with that ``k``.

    Returns ``(weights [T, k] fp32, expert_ids [T, k])``.
    """
    if isinstance(routing, int):
        routing = Routing(routing)
    probs = torch.softmax(router_logits.float(), dim=-1)
    if routing.num_groups > 1:
        probs = _keep_best_groups(probs, routing.num_groups, routing.topk_groups)
    weights, expert_ids = torch.topk(probs, routing.top_k, dim=-1)
    if routing.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routing.scaling != 1.0:
        weights = weights * routing.scaling
    return weights, expert_ids


def _keep_best_groups(probs: torch.Tensor, num_groups: int, keep: int) -> torch.Tensor:
    """``probs [T, E]`` with every expert outside each token's ``keep`` best groups (by
    their best expert) zeroed, as HF's DeepSeek-V2 router masks them."""
    grouped = probs.view(len(probs), num_groups, -1)
    best = torch.topk(grouped.amax(dim=-1), keep, dim=-1).indices
    mask = torch.zeros(len(probs), num_groups, dtype=torch.bool, device=probs.device)
    mask.scatter_(1, best, True)
    return grouped.masked_fill(~mask[:, :, None], 0.0).view_as(probs)


@dataclass(frozen=True)
class ExpertRoutes:
    """The (token, slot) pairs routed to this rank's experts, sorted by local expert (and by
    token within an expert), so that each expert's inputs are one contiguous block."""

    tokens: torch.Tensor  # [N] int64: the token of each pair
    weights: torch.Tensor  # [N] fp32: its routing weight
    counts: torch.Tensor  # [E_local] int64: the pairs of each local expert


def route_to_experts(
    weights: torch.Tensor, expert_ids: torch.Tensor, first_expert: int, num_experts: int
) -> ExpertRoutes:
    """Sort the pairs routed to experts ``[first_expert, first_expert + num_experts)``;
    pairs routed to other ranks' experts are dropped."""
    local = expert_ids.flatten() - first_expert
    outside = (local < 0) | (local >= num_experts)
    local = local.masked_fill(outside, num_experts)  # sorts after every local expert
    order = torch.argsort(local, stable=True)
    counts = torch.bincount(local, minlength=num_experts + 1)[:num_experts]
    kept = order[:int(counts.sum())]
    return ExpertRoutes(tokens=kept // expert_ids.shape[1], weights=weights.flatten()[kept],
                        counts=counts)


def loop_experts(
    inputs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, counts: torch.Tensor,
    act: nn.Module,
) -> torch.Tensor:
    """Expert outputs ``[N, H]`` of the pairs' ``inputs [N, H]`` (sorted by expert), one
    pair of GEMMs per expert that received tokens."""
    return each_expert(inputs, counts,
                       lambda expert, block: F.linear(act(F.linear(block, w13[expert])),
                                                      w2[expert]))


def each_expert(inputs: torch.Tensor, counts: torch.Tensor,
                run: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``run(expert, block)`` on each local expert's block of ``inputs [N, H]`` (sorted by
    expert, ``counts`` rows each) that received tokens; the outputs in the same order."""
    outputs = [run(expert, block)
               for expert, block in enumerate(inputs.split(counts.tolist())) if len(block)]
    return torch.cat(outputs) if outputs else inputs.new_empty(0, inputs.shape[1])


def grouped_experts(
    inputs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, counts: torch.Tensor,
    act: nn.Module,
) -> torch.Tensor:
    """``loop_experts`` in two grouped GEMMs (``torch._grouped_mm``) over all experts."""
    offsets = counts.cumsum(0).to(torch.int32)
    hidden = act(torch._grouped_mm(inputs, w13.transpose(1, 2), offs=offsets))
    return torch._grouped_mm(hidden, w2.transpose(1, 2), offs=offsets)


def grouped_mm_fits(*operands: torch.Tensor) -> bool:
    """Whether torch's CPU ``_grouped_mm`` takes these operands: it requires 16-byte aligned
    data and strides. Other devices use the loop: the grouped kernel is measured, and its
    dtype and capability limits known, on the CPU only."""
    return all(t.device.type == "cpu" and t.data_ptr() % 16 == 0
               and all(s * t.element_size() % 16 == 0 for s in t.stride() if s != 1)
               for t in operands)


# The kernel choice, measured with benchmarks/moe_kernel.py on an idle machine (one thread,
# 8 experts, top-2, tokens 1..1024; figures in benchmarks/RESULTS.md): on 64/96
# (hidden/intermediate) the grouped GEMM is 1.0-1.7x the loop's speed from 16 tokens (it
# saves the loop's Python work and small calls per expert) and 0.86-0.98x at 1 token; on
# 512/1792 the two are within -4%..+10% of each other at every count (torch's CPU
# _grouped_mm runs the same GEMMs, looping over the groups in C++). No crossover worth a
# switch, so: grouped wherever it runs. A padded bmm (benchmark only) wins on tiny bf16
# shapes but loses up to 5x on larger ones, computing every expert at the busiest one's count.
def expert_kernel(inputs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> ExpertKernel:
    """The grouped kernel where it runs, else the loop."""
    return grouped_experts if grouped_mm_fits(inputs, w13, w2) else loop_experts


class ExpertMLP(nn.Module):
    """One expert of a quantized checkpoint: its gate/up and down projections as linear
    layers of the checkpoint's method (AWQ, GPTQ, fp8, compressed-tensors: loaded, split and
    multiplied - on the CPU by the quantized kernels - as any linear layer's), sharded
    ``shard = (rank, size)`` over the intermediate dim like the stacked experts."""

    def __init__(self, hidden_size: int, intermediate_size: int,
                 shard: tuple[int, int]) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2,
                                                       tp_rank=shard[0], tp_size=shard[1])
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, tp_rank=shard[0],
                                           tp_size=shard[1])

    def forward(self, x: torch.Tensor, act: nn.Module) -> torch.Tensor:
        """This rank's partial sum of the expert's output (FusedMoE reduces them all once)."""
        return self.down_proj.partial(act(self.gate_up_proj(x)))


class FusedMoE(nn.Module):
    """``num_experts`` SiLU-gated MLPs; each token runs through the experts it was routed to
    and their outputs are summed with the routing weights.

    ``tp_rank``/``tp_size``/``enable_expert_parallel`` default (None) to this process's
    parallel state. HF checkpoints store each expert separately
    (``experts.{e}.w1/w2/w3.weight``); the weight loader's ``shard_id`` is
    ``(expert, "w1" | "w2" | "w3")`` with the global expert index, and it skips the experts
    another rank holds. Built in the scope of a checkpoint's quantization config
    (``experts_quantized``), the rank's experts are instead ``ExpertMLP`` modules in
    ``quantized`` (keyed by global index), loaded by their layers' own loaders; the model
    skips the tensors of other ranks' experts (``octavo.models.moe_block``).
    """

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int,
        tp_rank: int | None = None, tp_size: int | None = None,
        enable_expert_parallel: bool | None = None,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = resolve_tp(tp_rank, tp_size)
        if enable_expert_parallel is None:
            enable_expert_parallel = get_parallel_state().enable_expert_parallel
        self.expert_parallel = enable_expert_parallel and self.tp_size > 1
        self.num_experts = num_experts
        self.expert_group = get_parallel_state().ep
        if self.expert_group is not None:  # across data-parallel engines
            group = self.expert_group
            if num_experts % group.size:
                raise ValueError(f"{num_experts} experts cannot be split evenly over the "
                                 f"{group.size} ranks of the expert-parallel group "
                                 "(data_parallel_size x tensor_parallel_size)")
            num_local = num_experts // group.size
            self.local_experts = range(group.rank * num_local, (group.rank + 1) * num_local)
            self.intermediate_shard = (0, 1)
        elif self.expert_parallel:
            num_local = check_divisible("experts (expert parallelism)", num_experts,
                                        self.tp_size)
            self.local_experts = range(self.tp_rank * num_local, (self.tp_rank + 1) * num_local)
            self.intermediate_shard = (0, 1)  # whole experts
        else:
            self.local_experts = range(num_experts)
            self.intermediate_shard = (self.tp_rank, self.tp_size)
        self.local_intermediate = check_divisible("expert intermediate size",
                                                  intermediate_size, self.intermediate_shard[1])
        self.hidden_size, self.dtype = hidden_size, torch.get_default_dtype()
        self.act = SiluAndMul()
        self.quantized: nn.ModuleDict | None = None
        if experts_quantized():
            self.quantized = nn.ModuleDict({
                str(e): ExpertMLP(hidden_size, intermediate_size, self.intermediate_shard)
                for e in self.local_experts})
            return
        self.w13_weight = new_parameter(len(self.local_experts), 2 * self.local_intermediate,
                                        hidden_size, weight_loader=self.weight_loader)
        self.w2_weight = new_parameter(len(self.local_experts), hidden_size,
                                       self.local_intermediate, weight_loader=self.weight_loader)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[int, str]
    ) -> None:
        expert, which = shard_id
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} does not exist (the model has "
                             f"{self.num_experts} experts)")
        if which not in ("w1", "w2", "w3"):
            raise ValueError(f"expert weight {which!r} is not one of w1, w2, w3")
        if expert not in self.local_experts:
            return  # another rank's expert
        dst = param.data[expert - self.local_experts.start]
        if which == "w2":
            copy_shard(dst, loaded, 1, *self.intermediate_shard)
        else:
            size = self.local_intermediate
            half = dst.narrow(0, 0 if which == "w1" else size, size)
            copy_shard(half, loaded, 0, *self.intermediate_shard)

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor
    ) -> torch.Tensor:
        """``x [T, H]``, routing ``weights``/``expert_ids [T, k]`` -> ``[T, H]``.

        Runs this rank's experts on the pairs routed to them, weights each result by its
        routing weight, sums them per token and all-reduces the partial sums.
        """
        if self.expert_group is not None:
            return self._forward_across_engines(x, weights, expert_ids)
        routes = route_to_experts(weights, expert_ids, self.local_experts.start,
                                  len(self.local_experts))
        outputs = self._run_local_experts(x[routes.tokens], routes.counts)
        outputs = (outputs * routes.weights[:, None]).to(x.dtype)
        output = torch.zeros_like(x).index_add_(0, routes.tokens, outputs)
        return all_reduce(output) if self.tp_size > 1 else output

    def _run_local_experts(self, inputs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:  # one pair of quantized GEMMs per expert with tokens
            experts, first = self.quantized, self.local_experts.start
            return each_expert(inputs, counts,
                               lambda expert, block: experts[str(first + expert)](block,
                                                                                  self.act))
        kernel = expert_kernel(inputs, self.w13_weight, self.w2_weight)
        return kernel(inputs, self.w13_weight, self.w2_weight, counts, self.act)

    def _forward_across_engines(self, x: torch.Tensor, weights: torch.Tensor,
                                expert_ids: torch.Tensor) -> torch.Tensor:
        """Each tensor rank dispatches its share of the tokens over the expert group; the
        engine's tensor ranks then all-reduce the shares (rows of zeros elsewhere)."""
        assert self.expert_group is not None
        share = token_share(len(x), self.tp_rank, self.tp_size)
        part = dispatch_and_combine(x[share], weights[share], expert_ids[share],
                                    self.expert_group, len(self.local_experts),
                                    self._run_local_experts)
        if self.tp_size == 1:
            return part
        output = torch.zeros_like(x)
        output[share] = part
        return all_reduce(output)

    def run_dummy(self) -> None:
        """Take part in one pass of the expert group's collectives with no tokens: what an
        engine with no work does so that the engines with work are not left waiting."""
        device = next(self.parameters()).device
        x = torch.empty(0, self.hidden_size, dtype=self.dtype, device=device)
        no_routes = torch.empty(0, 1, dtype=torch.int64, device=device)
        self(x, no_routes.float(), no_routes)


def execute_dummy_batch(model: nn.Module) -> None:
    """An engine's step with no tokens while the expert group spans engines (vLLM's
    ``execute_dummy_batch``): every MoE layer, in order, takes part in its collectives with
    no tokens, so the engines that have work are not left waiting. Attention is
    data-parallel, so only the MoE layers need the other engines."""
    for module in model.modules():
        if isinstance(module, FusedMoE):
            module.run_dummy()
