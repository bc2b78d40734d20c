"""Mixture-of-experts feed-forward: a top-k router and experts stored as stacked tensors.

All experts' weights live in two tensors, ``w13 [E, 2 * I, H]`` (gate and up, i.e. HF's
``w1`` and ``w3``, stacked along the output) and ``w2 [E, H, I]`` (down), so that expert
parallelism can later hand each rank a slice of the leading dimension, and tensor
parallelism a slice of ``I``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.parallel import all_reduce, check_divisible
from octavo.models.layers.weights import copy_shard, new_parameter


def select_experts(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral routing: softmax over all experts (fp32), keep the top ``k``, renormalise.

    Returns ``(weights [T, k] fp32, expert_ids [T, k])``.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), expert_ids


class FusedMoE(nn.Module):
    """``num_experts`` SiLU-gated MLPs; each token runs through the experts it was routed to
    and their outputs are summed with the routing weights.

    HF checkpoints store each expert separately (``experts.{e}.w1/w2/w3.weight``); the
    weight loader's ``shard_id`` is ``(expert, "w1" | "w2" | "w3")``.
    """

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int,
        tp_rank: int = 0, tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.local_intermediate = check_divisible("expert intermediate size",
                                                  intermediate_size, tp_size)
        self.w13_weight = new_parameter(num_experts, 2 * self.local_intermediate, hidden_size,
                                        weight_loader=self.weight_loader)
        self.w2_weight = new_parameter(num_experts, hidden_size, self.local_intermediate,
                                       weight_loader=self.weight_loader)
        self.act = SiluAndMul()

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[int, str]
    ) -> None:
        expert, which = shard_id
        if not 0 <= expert < param.shape[0]:
            raise ValueError(f"expert {expert} does not exist (the model has "
                             f"{param.shape[0]} experts)")
        dst = param.data[expert]
        size = self.local_intermediate
        if which == "w2":
            copy_shard(dst, loaded, 1, self.tp_rank, self.tp_size)
        elif which in ("w1", "w3"):
            half = dst.narrow(0, 0 if which == "w1" else size, size)
            copy_shard(half, loaded, 0, self.tp_rank, self.tp_size)
        else:
            raise ValueError(f"expert weight {which!r} is not one of w1, w2, w3")

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor
    ) -> torch.Tensor:
        """``x [T, H]``, routing ``weights``/``expert_ids [T, k]`` -> ``[T, H]``.

        Loops over the experts that received tokens, each computing its tokens in one batch.
        """
        output = torch.zeros_like(x)
        for expert in expert_ids.unique().tolist():
            tokens, slots = torch.where(expert_ids == expert)
            hidden = self.act(F.linear(x[tokens], self.w13_weight[expert]))
            hidden = F.linear(hidden, self.w2_weight[expert]) * weights[tokens, slots, None]
            output.index_add_(0, tokens, hidden.to(output.dtype))
        return all_reduce(output) if self.tp_size > 1 else output
