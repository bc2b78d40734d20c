"""Qwen2-MoE and Qwen3-MoE (HF ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM``): the Qwen2
and Qwen3 decoders with a mixture of experts in every ``decoder_sparse_step``-th layer but
those of ``mlp_only_layers`` (dense MLPs of ``intermediate_size``).

Routed experts of ``moe_intermediate_size``, top-k weights renormalised where
``norm_topk_prob`` says; Qwen2-MoE adds one shared expert every token runs, scaled by a
sigmoid gate (``shared_expert``, ``shared_expert_gate``). Qwen2-MoE's q/k/v projections
have biases (``qkv_bias``), Qwen3-MoE normalises each head of q and k.
"""

from __future__ import annotations

from torch import nn

from octavo.models.llama import LlamaForCausalLM
from octavo.models.moe_block import GATE_UP_DOWN, ExpertNames, ExpertWeights, SparseMoeBlock


class Qwen2MoeForCausalLM(ExpertWeights, LlamaForCausalLM):
    expert_names = ExpertNames("mlp", GATE_UP_DOWN)

    def make_mlp(self, index: int) -> nn.Module:
        moe = self.config.moe
        if moe is not None and moe.layers[index]:
            return SparseMoeBlock(self.config.hidden_size, moe)
        return super().make_mlp(index)


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    qk_norm = True
