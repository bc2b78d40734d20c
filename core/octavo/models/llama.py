"""The Llama family: Llama 2/3 (incl. llama3 RoPE scaling), SmolLM, Mistral, Qwen2, Qwen3.

They share one decoder: RMSNorm -> attention with rotary embeddings -> RMSNorm -> gated SiLU
MLP, with residual adds. The members differ only in small traits, set as class attributes
on the architecture classes at the bottom (Qwen2 always has q/k/v biases, Qwen3 normalises q
and k per head) or read from the config (attention/MLP biases, sliding window, tied
embeddings, RoPE scaling).

Parameter names follow HF's, except that q/k/v and gate/up are fused (see
``CausalLM.stacked_params``). Under pipeline parallelism each stage builds only its layers
(``CausalLM`` says how the others are left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from octavo.attention.base import AttentionBackend, AttentionMetadata
from octavo.models.base import CausalLM, IntermediateTensors, PPMissingLayer, default_dtype
from octavo.models.config import ArchConfig
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from octavo.models.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding, rotary_embedding
from octavo.models.layers.sequence_parallel import (
    gather_tokens,
    heads_to_tokens,
    shard_tokens,
    sp_size,
    tokens_to_heads,
)


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ArchConfig,
        attn_backend: type[AttentionBackend],
        sliding_window: int | None,
        qkv_bias: bool,
        qk_norm: bool,
        rotary_emb: RotaryEmbedding | None = None,
        input_size: int | None = None,
    ) -> None:
        """``rotary_emb``: the model's shared rotary embedding (a layer of its own if None);
        ``input_size``: the width q/k/v are projected from (the hidden size if None)."""
        super().__init__()
        head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(input_size or config.hidden_size, head_dim,
                                          config.num_attention_heads,
                                          config.num_key_value_heads, bias=qkv_bias)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * head_dim, config.hidden_size,
                                        bias=config.attention_bias)
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.rotary_emb = rotary_emb or rotary_embedding(head_dim, config.rope)
        # Sequence parallelism: this rank attends with its share of its tensor rank's heads
        # (the model's check refused heads that do not divide).
        sp = sp_size()
        self.attn = attn_backend.make_impl(self.num_heads // sp, head_dim, head_dim**-0.5,
                                           self.num_kv_heads // sp, sliding_window)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        lengths = attn_metadata.rope_lengths
        q, k = self.rotary_emb(positions, q, k, None if lengths is None else
                               shard_tokens(lengths))
        # Sequence parallelism: every token of the step for this rank's heads, and back.
        q, k, v = tokens_to_heads([q, k, v], attn_metadata.num_actual_tokens)
        out = self.attn.forward(q, k, v, kv_cache, attn_metadata)
        out = heads_to_tokens(out.reshape(q.shape), num_tokens)
        return self.o_proj(out.reshape(num_tokens, q_size))


class LlamaMLP(nn.Module):
    @classmethod
    def of(cls, config: ArchConfig) -> LlamaMLP:
        return cls(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm decoder layer; the residual stream is passed along separately so each norm
    can fuse the add (see ``RMSNorm``)."""

    def __init__(self, config: ArchConfig, self_attn: LlamaAttention, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        # nn.Identity where the input is no residual stream (an EAGLE head's first layer).
        self.input_layernorm: RMSNorm | nn.Identity = RMSNorm(config.hidden_size,
                                                              config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    @classmethod
    def build(cls, config: ArchConfig, attn_backend: type[AttentionBackend], *,
              sliding_window: int | None = None, qkv_bias: bool | None = None,
              qk_norm: bool = False, rotary_emb: RotaryEmbedding | None = None,
              input_size: int | None = None, mlp: nn.Module | None = None,
              ) -> LlamaDecoderLayer:
        """A Llama-family decoder layer of ``config``'s shapes: the attention (``qkv_bias``
        defaults to ``config.attention_bias``; ``input_size`` is the width q/k/v are
        projected from, as ``LlamaAttention`` takes it) and ``mlp``, a gated SiLU MLP by
        default. Plugins build draft heads from it (EAGLE's layers)."""
        attention = LlamaAttention(
            config, attn_backend, sliding_window,
            qkv_bias=config.attention_bias if qkv_bias is None else qkv_bias,
            qk_norm=qk_norm, rotary_emb=rotary_emb, input_size=input_size)
        return cls(config, attention, LlamaMLP.of(config) if mlp is None else mlp)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, attn_metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    norm_cls: ClassVar[type[RMSNorm]] = RMSNorm  # of the final norm (Gemma's differs)

    def __init__(self, config: ArchConfig, layers: Sequence[nn.Module], layer_range: range,
                 embed: bool, norm: bool) -> None:
        """``layers``: every index, this stage's in ``layer_range`` and placeholders
        elsewhere; ``embed``/``norm``: whether this stage holds the embedding (the first
        stage, and the last of a tied model) and the final norm (the last stage)."""
        super().__init__()
        self.embed_tokens: VocabParallelEmbedding | PPMissingLayer = (
            VocabParallelEmbedding(config.vocab_size, config.hidden_size) if embed
            else PPMissingLayer())
        self.layers = nn.ModuleList(layers)
        self.layer_range = layer_range
        self.norm: RMSNorm | PPMissingLayer = (
            self.norm_cls(config.hidden_size, config.rms_norm_eps) if norm else PPMissingLayer())
        # Speculative decoding (EAGLE) sets this to keep the last forward's features before
        # the final norm in ``prenorm_hidden``; off, the no-spec path keeps nothing.
        self.keep_prenorm_hidden = False
        self.prenorm_hidden: torch.Tensor | None = None
        # EAGLE-3 sets this to the layer indices whose *input* (the residual stream after the
        # layers before it; index 0: the embeddings) the last forward keeps, in layer order,
        # in ``aux_hidden_states`` (vLLM's aux hidden states); empty, nothing is kept.
        self.aux_hidden_state_layers: frozenset[int] = frozenset()
        self.aux_hidden_states: list[torch.Tensor] = []

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """``inputs_embeds``: the first layer's input ``[T, hidden]`` given instead of the
        ids' embeddings (prompt embeddings; the first stage only)."""
        residual: torch.Tensor | None
        # Sequence parallelism (``layers.sequence_parallel``): this rank's slice of the
        # tokens through the layers, every rank's gathered at the end (pipeline stages are
        # refused with it, so the slice never crosses a stage).
        num_tokens, positions = positions.shape[0], shard_tokens(positions)
        if intermediate_tensors is not None:
            hidden, residual = intermediate_tensors.hidden, intermediate_tensors.residual
        elif inputs_embeds is not None:
            hidden, residual = shard_tokens(inputs_embeds), None
        else:
            hidden, residual = self.embed(shard_tokens(input_ids)), None
        hidden, residual = self.run_layers(positions, hidden, residual, kv_caches,
                                           attn_metadata)
        if isinstance(self.norm, PPMissingLayer):
            return IntermediateTensors(hidden, residual)
        hidden, prenorm = self.norm(hidden, residual)
        if self.keep_prenorm_hidden:
            self.prenorm_hidden = prenorm
        return gather_tokens(hidden, num_tokens)

    def run_layers(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This stage's layers in turn: the last one's output and residual stream."""
        local_layers = self.layers[self.layer_range.start : self.layer_range.stop]
        keep = self.aux_hidden_state_layers
        kept: list[torch.Tensor] = []
        for index, layer, kv_cache in zip(self.layer_range, local_layers, kv_caches,
                                          strict=True):
            if index in keep:
                kept.append(hidden if residual is None else hidden + residual)
            hidden, residual = layer(positions, hidden, residual, kv_cache, attn_metadata)
        if keep:
            self.aux_hidden_states = kept
        assert residual is not None  # every stage holds at least one layer
        return hidden, residual

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input for ``input_ids`` (Gemma scales the embeddings)."""
        return self.embed_tokens(input_ids)


class LlamaForCausalLM(CausalLM):
    # Traits of the family members (subclasses below).
    qkv_bias: ClassVar[bool] = False  # q/k/v biases even when the config has no attention_bias
    qk_norm: ClassVar[bool] = False  # RMSNorm of each head of q and k before RoPE
    rope_neox_style: ClassVar[bool] = True  # RoPE on halves (else adjacent pairs) of a head
    supports_pp = True
    supports_sp = True
    model: LlamaModel

    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = (
        (".qkv_proj.", ".q_proj.", "q"),
        (".qkv_proj.", ".k_proj.", "k"),
        (".qkv_proj.", ".v_proj.", "v"),
        (".gate_up_proj.", ".gate_proj.", 0),
        (".gate_up_proj.", ".up_proj.", 1),
    )

    def __init__(
        self, config: ArchConfig, attn_backend: type[AttentionBackend], dtype: torch.dtype
    ) -> None:
        super().__init__(config, attn_backend, dtype)
        with default_dtype(dtype):
            # One for all layers: it computes each step's cos/sin once (see RotaryEmbedding).
            self.rotary_emb = rotary_embedding(config.head_dim, config.rope,
                                               self.rope_neox_style)
            layers = [self.make_layer(index) if index in self.layer_range else PPMissingLayer()
                      for index in range(config.num_hidden_layers)]
            first, last = self.ranks.is_first_stage, self.ranks.is_last_stage
            tied = config.tie_word_embeddings
            self.model = LlamaModel(config, layers, self.layer_range,
                                    embed=first or (last and tied), norm=last)
            embed = self.model.embed_tokens
            tie_to = embed if tied and isinstance(embed, VocabParallelEmbedding) else None
            self.lm_head = (ParallelLMHead(config.vocab_size, config.hidden_size, tie_to=tie_to)
                            if last else PPMissingLayer())

    def make_layer(self, index: int) -> nn.Module:
        config = self.config
        return LlamaDecoderLayer.build(
            config, self.attn_backend, sliding_window=config.sliding_windows[index],
            qkv_bias=self.qkv_bias or config.qkv_bias or config.attention_bias,
            qk_norm=self.qk_norm, rotary_emb=self.rotary_emb, mlp=self.make_mlp(index))

    def make_mlp(self, index: int) -> nn.Module:
        """The feed-forward block of layer ``index`` (a mixture of experts in MoE
        subclasses)."""
        del index  # every layer's is the same
        return LlamaMLP.of(self.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, kv_caches, attn_metadata, intermediate_tensors,
                          inputs_embeds)

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)


class MistralForCausalLM(LlamaForCausalLM):
    """Llama with an optional sliding window (read from the config)."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
