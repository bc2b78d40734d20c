"""``SparseMoeBlock``: a decoder layer's mixture of experts - the router, the routed experts
(``FusedMoE``) and the shared experts every token runs - as Mixtral, Qwen2/3-MoE and
DeepSeek-V2 compute it (``MoEConfig`` says which parts a family has).

HF checkpoints store each expert's projections as tensors of their own, in each family's
names; ``ExpertNames`` maps them onto ``FusedMoE``'s stacked parameters and back, and
``ExpertWeights`` gives a model those mappings. The routed experts are one ``FusedMoE``
called with each token's routing, the interface expert parallelism dispatches through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from octavo.models.base import CausalLM
from octavo.models.config_parts import MoEConfig
from octavo.models.layers.linear import ReplicatedLinear
from octavo.models.layers.moe import FusedMoE, Routing, select_experts
from octavo.models.layers.quantization import quantization_scope
from octavo.models.llama import LlamaMLP

# FusedMoE's shard ids: gate (HF Mixtral's w1), up (w3) and down (w2) projections.
GATE, UP, DOWN = "w1", "w3", "w2"


class SparseMoeBlock(nn.Module):
    """Route each token to its top-k experts, mix their outputs by the routing weights and
    add the shared experts' output (gated by a sigmoid in Qwen2-MoE)."""

    def __init__(self, hidden_size: int, moe: MoEConfig, shared_name: str = "shared_expert",
                 ) -> None:
        """``shared_name``: the shared experts' module name in the checkpoints (Qwen's
        ``shared_expert``, DeepSeek's ``shared_experts``)."""
        super().__init__()
        self.routing = Routing(moe.top_k, moe.renormalize, moe.num_groups, moe.topk_groups,
                               moe.routed_scaling_factor)
        with quantization_scope(None):  # the router stays dense, as the tools leave it
            self.gate = ReplicatedLinear(hidden_size, moe.num_experts)
        self.experts = FusedMoE(moe.num_experts, hidden_size, moe.intermediate_size)
        self.shared_name = shared_name if moe.shared_intermediate_size else None
        if self.shared_name is not None:
            self.add_module(self.shared_name,
                            LlamaMLP(hidden_size, moe.shared_intermediate_size, bias=False))
        with quantization_scope(None):
            self.shared_expert_gate = (ReplicatedLinear(hidden_size, 1)
                                       if moe.shared_expert_gate else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = select_experts(self.gate(x), self.routing)
        out = self.experts(x, weights, expert_ids)
        if self.shared_name is None:
            return out
        shared = getattr(self, self.shared_name)(x)
        if self.shared_expert_gate is not None:
            shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
        return out + shared


@dataclass(frozen=True)
class ExpertNames:
    """Checkpoint names of expert ``e``'s tensors: ``{prefix}.{module}.experts.{e}.{part}
    .{suffix}``, ``parts`` mapping each checkpoint part to its ``FusedMoE`` shard id. Ours:
    dense, ``{prefix}.{ours}.experts.w13_weight`` / ``w2_weight`` (suffix ``weight`` only);
    quantized (``FusedMoE.quantized``), the expert's own layers
    ``{prefix}.{ours}.experts.quantized.{e}.gate_up_proj`` / ``down_proj`` with the
    checkpoint's suffix (``qweight``, ``scales``, ``weight_scale``, ...)."""

    module: str
    parts: tuple[tuple[str, str], ...]  # (checkpoint part, GATE | UP | DOWN)
    ours: str = "mlp"

    def expert_of(self, hf_name: str) -> tuple[str, int, str, str] | None:
        """(prefix, expert, part, suffix) of an expert's tensor; None for other tensors."""
        match = re.match(rf"^(.*)\.{self.module}\.experts\.(\d+)\.(\w+)\.(\w+)$", hf_name)
        if match is None or match[3] not in dict(self.parts):
            return None
        return match[1], int(match[2]), match[3], match[4]

    def experts(self, model: nn.Module, prefix: str) -> FusedMoE | None:
        """The layer's ``FusedMoE`` (None on a pipeline stage without the layer)."""
        try:
            experts = model.get_submodule(f"{prefix}.{self.ours}.experts")
        except AttributeError:
            return None
        return experts if isinstance(experts, FusedMoE) else None

    def param_for(self, model: nn.Module, hf_name: str) -> tuple[str, object] | None:
        """The parameter and shard id of an expert's tensor; None for others."""
        found = self.expert_of(hf_name)
        if found is None:
            return None
        prefix, expert, part, suffix = found
        which = dict(self.parts)[part]
        experts = self.experts(model, prefix)
        if experts is not None and experts.quantized is not None:
            layer = "down_proj" if which == DOWN else "gate_up_proj"
            shard = None if which == DOWN else (0 if which == GATE else 1)
            return f"{prefix}.{self.ours}.experts.quantized.{expert}.{layer}.{suffix}", shard
        stacked = "w2" if which == DOWN else "w13"
        return f"{prefix}.{self.ours}.experts.{stacked}_{suffix}", (expert, which)

    def elsewhere(self, model: nn.Module, hf_name: str) -> bool:
        """Whether the tensor is a quantized expert another rank holds (skipped here; the
        dense stacked loader skips such experts itself)."""
        found = self.expert_of(hf_name)
        if found is None:
            return False
        experts = self.experts(model, found[0])
        return (experts is not None and experts.quantized is not None
                and found[1] not in experts.local_experts)

    def hf_names(self, model: nn.Module, param_name: str) -> list[str] | None:
        """The checkpoint tensors of this rank's experts that fill a parameter; None for
        other parameters."""
        quantized = re.match(rf"^(.*)\.{self.ours}\.experts\.quantized\.(\d+)\."
                             rf"(gate_up_proj|down_proj)\.(\w+)$", param_name)
        if quantized is not None:
            prefix, expert, layer, suffix = quantized.groups()
            return [f"{prefix}.{self.module}.experts.{expert}.{part}.{suffix}"
                    for part in self.checkpoint_parts(down=layer == "down_proj")]
        match = re.match(rf"^(.*)\.{self.ours}\.experts\.(w13|w2)_weight$", param_name)
        if match is None:
            return None
        prefix, stacked = match.groups()
        experts = self.experts(model, prefix)
        assert experts is not None
        return [f"{prefix}.{self.module}.experts.{expert}.{part}.weight"
                for expert in experts.local_experts
                for part in self.checkpoint_parts(down=stacked == "w2")]

    def checkpoint_parts(self, down: bool) -> list[str]:
        """The checkpoint parts of the down projection, or of gate and up in that order."""
        wanted = (DOWN,) if down else (GATE, UP)
        return [part for which in wanted for part, shard in self.parts if shard == which]


# Qwen's and DeepSeek's checkpoints (and Jamba's, under feed_forward).
GATE_UP_DOWN = (("gate_proj", GATE), ("up_proj", UP), ("down_proj", DOWN))


class ExpertWeights(CausalLM):
    """Loads and lists the experts' weights by ``expert_names`` (put it before the model
    class it extends: ``class M(ExpertWeights, LlamaForCausalLM)``)."""

    expert_names: ClassVar[ExpertNames]
    # The MoE, Mamba (Jamba) and latent-attention (DeepSeek) members of the Llama family
    # have not been built for sequence parallelism.
    supports_sp: ClassVar[bool] = False

    def param_for(self, hf_name: str) -> tuple[str, object]:
        found = self.expert_names.param_for(self, hf_name)
        return super().param_for(hf_name) if found is None else found

    def ignores_weight(self, hf_name: str) -> bool:
        return self.expert_names.elsewhere(self, hf_name) or super().ignores_weight(hf_name)

    def hf_names_for(self, param_name: str) -> list[str]:
        names = self.expert_names.hf_names(self, param_name)
        return super().hf_names_for(param_name) if names is None else names
