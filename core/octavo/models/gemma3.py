"""Gemma 3, text only (HF ``Gemma3ForCausalLM``).

A Llama-shaped decoder with Gemma's differences, each as HF transformers computes it:
- layers alternate between sliding-window (local) and full (global) attention, each kind
  with its own RoPE base (``ArchConfig.local_rope`` for the local ones), global RoPE scaling
  where the config sets it;
- four norms per layer: the attention and the MLP outputs are normalised before their
  residual add too; every norm (and the per-head q/k norms) is ``GemmaRMSNorm``, weight
  applied as ``1 + w`` in fp32;
- the embedding is scaled by ``sqrt(hidden_size)``, rounded to the model dtype as HF does;
- queries are scaled by ``query_pre_attn_scalar ** -0.5``; a GeGLU MLP (tanh GELU);
- final logits soft-capped where the config sets ``final_logit_softcapping``. A config's
  ``attn_logit_softcapping`` (null in every released Gemma 3) is ignored, with a warning,
  as HF's Gemma 3 ignores it: its attention takes no soft cap.

Gemma 2 (``gemma2.py``) is this model without the q/k norms, with one RoPE for both kinds
and soft-capped attention scores.

Parameter names follow HF's with q/k/v and gate/up fused, as in ``llama.py``; tensor and
pipeline parallelism work as there (each stage builds only its layers).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from octavo.attention.base import AttentionBackend, AttentionMetadata
from octavo.models.base import CausalLM, IntermediateTensors, PPMissingLayer, default_dtype
from octavo.models.config import ArchConfig
from octavo.models.layers.activation import GeluAndMul
from octavo.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from octavo.models.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from octavo.models.layers.norm import GemmaRMSNorm
from octavo.models.layers.rotary import RotaryEmbedding, rotary_embedding
from octavo.models.llama import LlamaModel

logger = logging.getLogger(__name__)

# HF activation names -> torch's GELU approximation.
GELU_APPROXIMATIONS = {"gelu_pytorch_tanh": "tanh"}


class Gemma3Attention(nn.Module):
    def __init__(self, config: ArchConfig, attn_backend: type[AttentionBackend],
                 sliding_window: int | None, rotary_emb: RotaryEmbedding, qk_norm: bool,
                 soft_cap: float | None) -> None:
        """``rotary_emb``: the model's one for this layer's kind (local or global);
        ``qk_norm``: whether each head of q and k is normalised before RoPE; ``soft_cap``:
        of the attention scores (None: none)."""
        super().__init__()
        head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, config.num_attention_heads,
                                          config.num_key_value_heads, bias=config.attention_bias)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * head_dim, config.hidden_size,
                                        bias=config.attention_bias)
        self.q_norm = GemmaRMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = GemmaRMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.rotary_emb = rotary_emb
        scalar = config.query_pre_attn_scalar or head_dim
        self.attn = attn_backend.make_impl(self.num_heads, head_dim, scalar**-0.5,
                                           self.num_kv_heads, sliding_window,
                                           logits_soft_cap=soft_cap)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k, attn_metadata.rope_lengths)
        out = self.attn.forward(q, k, v, kv_cache, attn_metadata)
        return self.o_proj(out.reshape(num_tokens, q_size))


class Gemma3MLP(nn.Module):
    """GeGLU: ``down(gelu(gate(x)) * up(x))``, gate and up fused."""

    def __init__(self, hidden_size: int, intermediate_size: int, approximate: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=False)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False)
        self.act = GeluAndMul(approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class Gemma3DecoderLayer(nn.Module):
    """Norm -> attention -> norm, + residual; norm -> MLP -> norm, + residual. The residual
    stream travels separately (as in ``LlamaDecoderLayer``): the input and pre-feedforward
    norms fuse the adds, the post-attention and post-feedforward norms see only their block's
    output, so every sum is HF's."""

    def __init__(self, config: ArchConfig, self_attn: Gemma3Attention, mlp: Gemma3MLP) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

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
        hidden = self.post_attention_layernorm(hidden)
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        hidden = self.post_feedforward_layernorm(self.mlp(hidden))
        return hidden, residual


class Gemma3Model(LlamaModel):
    """``LlamaModel`` with Gemma's final norm and embeddings scaled by sqrt(hidden_size)."""

    norm_cls = GemmaRMSNorm

    def __init__(self, config: ArchConfig, layers: Sequence[nn.Module], layer_range: range,
                 embed: bool, norm: bool, dtype: torch.dtype) -> None:
        super().__init__(config, layers, layer_range, embed, norm)
        # HF keeps sqrt(hidden_size) as an fp32 tensor and rounds it to the weights' dtype.
        scale = torch.tensor(config.hidden_size**0.5, dtype=torch.float32).to(dtype)
        self.register_buffer("embed_scale", scale, persistent=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids' embeddings times ``sqrt(hidden_size)``, what HF's embedding module gives."""
        return self.embed_tokens(input_ids) * self.embed_scale


class Gemma3ForCausalLM(CausalLM):
    model: Gemma3Model
    supports_pp = True
    qk_norm: ClassVar[bool] = True
    # Whether the config's attn_logit_softcapping caps the scores (HF: Gemma 2's, not 3's).
    caps_attention: ClassVar[bool] = False
    activations = tuple(GELU_APPROXIMATIONS)
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
        self.attention_soft_cap = config.attn_logit_softcapping if self.caps_attention else None
        if config.attn_logit_softcapping is not None and not self.caps_attention:
            logger.warning("%s ignores attn_logit_softcapping=%s, as HF transformers does",
                           type(self).__name__, config.attn_logit_softcapping)
        with default_dtype(dtype):
            # One per layer kind, shared by the layers of that kind (cos/sin once a step).
            self.rotary_emb = rotary_embedding(config.head_dim, config.rope)
            self.local_rotary_emb = (rotary_embedding(config.head_dim, config.local_rope)
                                     if config.local_rope is not None else self.rotary_emb)
            layers = [self.make_layer(index) if index in self.layer_range else PPMissingLayer()
                      for index in range(config.num_hidden_layers)]
            first, last = self.ranks.is_first_stage, self.ranks.is_last_stage
            tied = config.tie_word_embeddings
            self.model = Gemma3Model(config, layers, self.layer_range,
                                     embed=first or (last and tied), norm=last, dtype=dtype)
            embed = self.model.embed_tokens
            tie_to = embed if tied and isinstance(embed, VocabParallelEmbedding) else None
            self.lm_head = (ParallelLMHead(config.vocab_size, config.hidden_size, tie_to=tie_to)
                            if last else PPMissingLayer())

    def make_layer(self, index: int) -> Gemma3DecoderLayer:
        config = self.config
        window = config.sliding_windows[index]
        rotary = self.rotary_emb if window is None else self.local_rotary_emb
        attention = Gemma3Attention(config, self.attn_backend, window, rotary, self.qk_norm,
                                    self.attention_soft_cap)
        mlp = Gemma3MLP(config.hidden_size, config.intermediate_size,
                        GELU_APPROXIMATIONS[config.hidden_act])
        return Gemma3DecoderLayer(config, attention, mlp)

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
        """Scaled, as HF Gemma 3's ``get_input_embeddings()`` module returns them."""
        return self.model.embed(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits, soft-capped as ``cap * tanh(logits / cap)`` where the config says."""
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
