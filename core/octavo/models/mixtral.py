"""Mixtral: the Llama decoder with a sparse mixture of experts in place of the MLP.

HF checkpoints name the MoE block ``block_sparse_moe`` with one tensor per expert
(``experts.{e}.w1/w2/w3.weight``); here it is ``mlp`` with the experts stacked
(``mlp.experts.w13_weight``, ``mlp.experts.w2_weight``, see ``FusedMoE``). With expert
parallelism on (``ParallelState.enable_expert_parallel``, set by the worker) each tensor
rank holds, loads and expects only its own experts.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from octavo.models.layers.linear import ReplicatedLinear
from octavo.models.layers.moe import FusedMoE, select_experts
from octavo.models.llama import LlamaForCausalLM

_HF_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")
_STACKED_EXPERTS = re.compile(r"^(.*)\.mlp\.experts\.(w13|w2)_weight$")


class MixtralMoE(nn.Module):
    """Route each token to its top-k experts and mix their outputs."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int,
                 top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = ReplicatedLinear(hidden_size, num_experts)
        self.experts = FusedMoE(num_experts, hidden_size, intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = select_experts(self.gate(x), self.top_k)
        return self.experts(x, weights, expert_ids)


class MixtralForCausalLM(LlamaForCausalLM):
    stacked_params = LlamaForCausalLM.stacked_params + (
        (".mlp.gate.", ".block_sparse_moe.gate.", None),
    )

    def make_mlp(self) -> nn.Module:
        config = self.config
        if config.num_experts < 1 or not 1 <= config.num_experts_per_tok <= config.num_experts:
            raise ValueError(f"Mixtral needs num_local_experts >= 1 and 1 <= num_experts_per_tok "
                             f"<= num_local_experts, got {config.num_experts} and "
                             f"{config.num_experts_per_tok}")
        return MixtralMoE(config.hidden_size, config.intermediate_size, config.num_experts,
                          config.num_experts_per_tok)

    def param_for(self, hf_name: str) -> tuple[str, object]:
        match = _HF_EXPERT.match(hf_name)
        if match is None:
            return super().param_for(hf_name)
        prefix, expert, which = match.groups()
        stacked = "w2" if which == "w2" else "w13"
        return f"{prefix}.mlp.experts.{stacked}_weight", (int(expert), which)

    def hf_names_for(self, param_name: str) -> list[str]:
        match = _STACKED_EXPERTS.match(param_name)
        if match is None:
            return super().hf_names_for(param_name)
        prefix, stacked = match.groups()
        parts = ("w2",) if stacked == "w2" else ("w1", "w3")
        experts = self.get_submodule(f"{prefix}.mlp.experts")
        assert isinstance(experts, FusedMoE), "a stacked expert weight outside a FusedMoE"
        return [f"{prefix}.block_sparse_moe.experts.{expert}.{part}.weight"
                for expert in experts.local_experts for part in parts]
