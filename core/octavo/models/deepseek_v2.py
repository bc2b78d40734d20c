"""DeepSeek-V2 (HF ``DeepseekV2ForCausalLM``; V2-Lite's shapes are the reference): the Llama
decoder with multi-head latent attention (MLA) and a mixture of experts.

Attention: each token's keys and values for every head come from one latent of
``kv_lora_rank`` values (``kv_a_proj_with_mqa``, normalised) through ``kv_b_proj``, plus a
``qk_rope_head_dim`` key part that carries the position and is shared by all heads. The
KV cache keeps only the latent and that key part (``MLASpec``: ``kv_lora_rank +
qk_rope_head_dim`` values per token and layer, against ``2 * heads * head_dim`` for the
same heads as plain attention); the backend's ``MLAImpl`` attends over it. RoPE rotates
adjacent pairs of dims (HF's complex-number form) with YaRN scaling, whose ``mscale_all_dim``
also scales the softmax (``yarn_mscale`` squared, as HF's ``yarn_apply_mscale``). Queries
come from ``q_proj`` (V2-Lite) or the low-rank ``q_a_proj``, ``q_a_layernorm``,
``q_b_proj``. Both latent norms use eps 1e-6, as HF's.

Tensor parallelism splits the heads (q, ``kv_b_proj``, ``o_proj``); the latent projection
and the cache are whole on every rank, as in vLLM.

MLP: dense in the first ``first_k_dense_replace`` layers, then routed experts with
DeepSeek's routing (softmax, greedy or group-limited top-k, ``routed_scaling_factor``, no
renormalisation - HF's router ignores ``norm_topk_prob``) plus ``n_shared_experts``
shared experts run as one MLP (``shared_experts``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from octavo.attention.base import AttentionBackend, AttentionMetadata, MLADims
from octavo.kv.cache_spec import MLASpec
from octavo.models.config import ArchConfig
from octavo.models.config_parts import MLAConfig
from octavo.models.layers.linear import (
    ColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.parallel import check_divisible, resolve_tp
from octavo.models.layers.rotary import RotaryEmbedding, yarn_mscale
from octavo.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from octavo.models.moe_block import GATE_UP_DOWN, ExpertNames, ExpertWeights, SparseMoeBlock

# HF builds both latent norms with DeepseekV2RMSNorm's default eps, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class MLAUpProjection(ColumnParallelLinear):
    """``kv_b_proj``: a latent to each head's key part and value. The absorbed decode reads
    its weight, so a platform's GEMM must leave it in place."""

    def reads_weight_with_cpu_gemm(self) -> bool:
        return True


def mla_softmax_scale(config: ArchConfig, mla: MLAConfig) -> float:
    """``qk_head_dim ** -0.5``, times YaRN's ``mscale_all_dim`` temperature squared."""
    scale = mla.qk_head_dim ** -0.5
    rope = config.rope
    if rope.rope_type != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


class DeepseekV2Attention(nn.Module):
    def __init__(self, config: ArchConfig, attn_backend: type[AttentionBackend],
                 rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        mla = config.mla
        assert mla is not None
        self.mla = mla
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.num_heads = check_divisible("attention heads", heads, resolve_tp(None, None)[1])
        if mla.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, heads * mla.qk_head_dim)
        else:
            self.q_a_proj = ReplicatedLinear(hidden, mla.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(mla.q_lora_rank, heads * mla.qk_head_dim)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, mla.kv_lora_rank + mla.qk_rope_head_dim,
                                                   bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = MLAUpProjection(mla.kv_lora_rank,
                                         heads * (mla.qk_nope_head_dim + mla.v_head_dim))
        self.o_proj = RowParallelLinear(heads * mla.v_head_dim, hidden,
                                        bias=config.attention_bias)
        self.rotary_emb = rotary_emb
        dims = MLADims(self.num_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim,
                       mla.v_head_dim, mla.kv_lora_rank)
        self.attn = attn_backend.make_mla_impl(dims, mla_softmax_scale(config, mla),
                                               self.kv_b_proj)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        mla, num_tokens = self.mla, hidden.shape[0]
        if mla.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_pe = q.view(num_tokens, self.num_heads, mla.qk_head_dim).split(
            [mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden).split(
            [mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe[:, None, :],
                                     attn_metadata.rope_lengths)
        out = self.attn.forward(q_nope, q_pe, latent, k_pe[:, 0], kv_cache, attn_metadata)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * mla.v_head_dim))


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm layer around latent attention (a class of its own: the CPU's fused
    Llama layer, which it is not, switches Llama's by exact class)."""


class DeepseekV2ForCausalLM(ExpertWeights, LlamaForCausalLM):
    rope_neox_style = False
    # Only gate/up fuse (q_proj is a projection of its own here, not part of a qkv).
    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = (
        (".gate_up_proj.", ".gate_proj.", 0),
        (".gate_up_proj.", ".up_proj.", 1),
    )
    expert_names = ExpertNames("mlp", GATE_UP_DOWN)

    def __init__(self, config: ArchConfig, attn_backend: type[AttentionBackend],
                 dtype: torch.dtype) -> None:
        if config.mla is None:
            raise ValueError("DeepseekV2ForCausalLM needs a latent attention config "
                             "(kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)")
        super().__init__(config, attn_backend, dtype)

    @property
    def mla_spec(self) -> MLASpec:
        assert self.config.mla is not None
        return MLASpec(self.config.mla.kv_lora_rank, self.config.mla.qk_rope_head_dim)

    def make_layer(self, index: int) -> LlamaDecoderLayer:
        attention = DeepseekV2Attention(self.config, self.attn_backend, self.rotary_emb)
        return DeepseekV2DecoderLayer(self.config, attention, self.make_mlp(index))  # type: ignore[arg-type]

    def make_mlp(self, index: int) -> nn.Module:
        config = self.config
        if config.moe is not None and config.moe.layers[index]:
            return SparseMoeBlock(config.hidden_size, config.moe, shared_name="shared_experts")
        return LlamaMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
