"""Jamba (HF ``JambaForCausalLM``): Mamba layers interleaved with attention layers, and a
mixture of experts in every ``expert_layer_period``-th layer's feed-forward block.

Layer ``i`` attends when ``i % attn_layer_period == attn_layer_offset`` (plain grouped-query
attention without positions - Jamba has no RoPE) and is a Mamba mixer otherwise
(``octavo.models.layers.mamba``), which keeps a fixed-size state per request instead of a
KV cache: the model reports those layers as ``SSM_LAYER`` and the engine gives each running
request a state slot (``octavo.kv.state_pool``). Its experts are routed by the top-k of a
softmax, the weights not renormalised, under HF's names ``feed_forward.router`` and
``feed_forward.experts``. Each layer is pre-norm: ``input_layernorm`` before the mixer or
attention, ``pre_ff_layernorm`` before the feed-forward block; the final norm is
``final_layernorm``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from octavo.attention.base import AttentionBackend, AttentionMetadata
from octavo.kv.cache_spec import SSM_LAYER
from octavo.models.config import ArchConfig
from octavo.models.layers.linear import QKVParallelLinear, RowParallelLinear
from octavo.models.layers.mamba import MambaMixer, state_shape
from octavo.models.layers.norm import RMSNorm
from octavo.models.llama import LlamaForCausalLM, LlamaMLP
from octavo.models.moe_block import GATE_UP_DOWN, ExpertNames, ExpertWeights, SparseMoeBlock


class JambaAttention(nn.Module):
    """Grouped-query attention without positional embedding."""

    def __init__(self, config: ArchConfig, attn_backend: type[AttentionBackend]) -> None:
        super().__init__()
        head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, config.num_attention_heads,
                                          config.num_key_value_heads)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * head_dim, config.hidden_size)
        self.attn = attn_backend.make_impl(self.num_heads, head_dim, head_dim**-0.5,
                                           self.num_kv_heads)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        del positions  # no RoPE
        num_tokens = hidden.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        out = self.attn.forward(q.view(num_tokens, self.num_heads, self.head_dim),
                                k.view(num_tokens, self.num_kv_heads, self.head_dim),
                                v.view(num_tokens, self.num_kv_heads, self.head_dim),
                                kv_cache, attn_metadata)
        return self.o_proj(out.reshape(num_tokens, q_size))


class JambaDecoderLayer(nn.Module):
    """Norm -> attention or Mamba mixer -> + residual; norm -> feed-forward -> + residual
    (the residual stream travels separately, as in ``LlamaDecoderLayer``)."""

    def __init__(self, config: ArchConfig, mixer: nn.Module, feed_forward: nn.Module,
                 attends: bool) -> None:
        super().__init__()
        self.mixer_name = "self_attn" if attends else "mamba"  # HF's names
        self.add_module(self.mixer_name, mixer)
        self.feed_forward = feed_forward
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attends = attends

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """``cache``: the layer's KV cache, or for a Mamba layer its state tensor."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        mixer = getattr(self, self.mixer_name)
        if self.attends:
            hidden = mixer(positions, hidden, cache, attn_metadata)
        else:
            hidden = mixer(hidden, cache, attn_metadata)
        hidden, residual = self.pre_ff_layernorm(hidden, residual)
        return self.feed_forward(hidden), residual


class JambaForCausalLM(ExpertWeights, LlamaForCausalLM):
    supports_pp = False
    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = (
        *LlamaForCausalLM.stacked_params,
        (".feed_forward.gate.", ".feed_forward.router.", None),
        ("model.norm.", "model.final_layernorm.", None),
    )
    expert_names = ExpertNames("feed_forward", GATE_UP_DOWN, ours="feed_forward")

    def __init__(self, config: ArchConfig, attn_backend: type[AttentionBackend],
                 dtype: torch.dtype) -> None:
        if config.mamba is None:
            raise ValueError("JambaForCausalLM needs its Mamba fields (mamba_d_state, "
                             "mamba_d_conv, mamba_expand, attn_layer_period, ...)")
        super().__init__(config, attn_backend, dtype)

    def make_layer(self, index: int) -> nn.Module:
        config, mamba = self.config, self.config.mamba
        assert mamba is not None
        attends = mamba.attention_layers[index]
        mixer: nn.Module = (JambaAttention(config, self.attn_backend) if attends
                            else MambaMixer(mamba.dims, config.rms_norm_eps))
        return JambaDecoderLayer(config, mixer, self.make_mlp(index), attends)

    def make_mlp(self, index: int) -> nn.Module:
        config = self.config
        if config.moe is not None and config.moe.layers[index]:
            return SparseMoeBlock(config.hidden_size, config.moe)
        return LlamaMLP(config.hidden_size, config.intermediate_size, bias=False)

    def layer_kv_specs(self) -> list[int | str | None]:
        mamba = self.config.mamba
        assert mamba is not None
        return [None if attends else SSM_LAYER for attends in mamba.attention_layers]

    def ssm_state_shape(self, num_slots: int) -> tuple[int, ...]:
        assert self.config.mamba is not None
        return state_shape(self.config.mamba.dims, num_slots, self.ranks.tp_size)
