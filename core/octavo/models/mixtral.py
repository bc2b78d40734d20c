"""Mixtral: the Llama decoder with a sparse mixture of experts in place of the MLP.

HF checkpoints name the MoE block ``block_sparse_moe`` with one tensor per expert
(``experts.{e}.w1/w2/w3.weight``); here it is ``mlp`` with the experts stacked
(``mlp.experts.w13_weight``, ``mlp.experts.w2_weight``, see ``FusedMoE``). With expert
parallelism on (``ParallelState.enable_expert_parallel``, set by the worker) each tensor
rank holds, loads and expects only its own experts.
"""

from __future__ import annotations

from torch import nn

from octavo.models.llama import LlamaForCausalLM
from octavo.models.moe_block import DOWN, GATE, UP, ExpertNames, ExpertWeights, SparseMoeBlock


class MixtralForCausalLM(ExpertWeights, LlamaForCausalLM):
    stacked_params = LlamaForCausalLM.stacked_params + (
        (".mlp.gate.", ".block_sparse_moe.gate.", None),
    )
    expert_names = ExpertNames("block_sparse_moe", (("w1", GATE), ("w3", UP), ("w2", DOWN)))

    def make_mlp(self, index: int) -> nn.Module:
        moe = self.config.moe
        if moe is None:
            raise ValueError("Mixtral needs num_local_experts >= 1")
        return SparseMoeBlock(self.config.hidden_size, moe)
