"""The ``AttentionBackend`` contract (see docs/architecture.md, AttentionBackend).

The model runner flattens all scheduled tokens of a step - prefill chunks and decodes
alike - into one "super-sequence" of ``T`` tokens. For each attention layer the backend
gets that flattened query/key/value, the layer's paged KV cache and the step's
:class:`AttentionMetadata`; it writes the new K/V into their slots and returns the
attention output of every query token, causal within each request (a chunk also sees
the request's earlier tokens already in the cache).

A backend must write *all* of the step's new K/V into the cache before any request of the
step reads the cache: the prefix cache hands a block to a second request in the same step
that a first request is filling (a burst sharing a prompt prefix), so that second request
reads keys written by the first one within the same forward pass.

KV cache layout, one tensor per layer: ``[2, num_blocks, block_size, num_kv_heads,
head_dim]`` (index 0 holds keys, 1 values). Slot ``s`` is block ``s // block_size``,
offset ``s % block_size``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from octavo.attention.kv_quant import calculated_scales


@dataclass
class AttentionMetadata:
    """Per-step layout of the flattened batch; all tensors live on the model's device.

    Requests are laid out back to back: request ``i`` owns query tokens
    ``query_start_loc[i]:query_start_loc[i+1]``, which are the *last* tokens of its
    ``seq_lens[i]`` tokens of context (cached prefix + new tokens).
    """

    num_actual_tokens: int  # T: flattened query tokens of this step
    num_reqs: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]: context length including this step's tokens
    block_tables: torch.Tensor  # int32 [num_reqs, max_blocks_per_req]
    slot_mapping: torch.Tensor  # int64 [T]: cache slot of each new token
    max_query_len: int
    max_seq_len: int
    # Host copies of the small index tensors, so backends can loop without device syncs.
    query_start_loc_cpu: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None
    # Speculative token trees verified this step (None: none). Only backends with
    # ``supports_token_trees`` get one.
    token_trees: TokenTrees | None = None
    # int64 [T]: each token's max(prompt length, position + 1), the sequence length HF's
    # length-dependent RoPE scalings (longrope, dynamic) see; filled only for models whose
    # RoPE needs it (``CausalLM.uses_rope_lengths``), None otherwise.
    rope_lengths: torch.Tensor | None = None
    # int64 [num_reqs]: each request's slot of the per-request state of SSM layers
    # (``NewRequestData.state_slot``); None for models without them.
    state_slots: torch.Tensor | None = None
    # What a backend derives from this metadata once per step (index tensors, masks) and
    # reuses in every layer, keyed by the backend; starts empty each step.
    backend_state: dict[str, Any] = field(default_factory=dict)
    # A model with several KV groups (octavo.kv.cache_spec): every group's metadata, this one
    # (group 0's) first - same layout, the group's own block tables and slot mapping. The
    # model runner wraps each layer's impl in a ``KVGroupAttention`` that hands it its
    # group's, so backends read ``block_tables``/``slot_mapping`` as always. Empty with one
    # group.
    kv_groups: list[AttentionMetadata] = field(default_factory=list, repr=False)


@dataclass
class TokenTrees:
    """Requests whose query tokens are ``[last token, draft tree nodes]``
    (``octavo.spec_decode.tree``). Their positions follow the tree's depths, so a node's position
    is not its place in the query; the nodes are written to consecutive slots all the same
    (the verifier moves the accepted ones into place). Query ``i`` of such a request sees
    the whole cached context and, among the request's new tokens, only the columns
    ``ancestors[i]`` marks."""

    requests: frozenset[int]  # indices into the step's requests
    ancestors: torch.Tensor  # bool [1 + N, 1 + N] on the host; q tokens use [:q, :q]


class AttentionImpl(ABC):
    """One attention layer's computation, built by :meth:`AttentionBackend.make_impl`."""

    # Scores soft-capped as ``cap * tanh(score / cap)`` before the softmax (Gemma 2's
    # attn_logit_softcapping; vLLM's name); set by make_impl, only on backends that
    # ``supports_logits_soft_cap``.
    logits_soft_cap: float | None = None
    # An fp8 KV cache stores keys / k_scale and values / v_scale (``octavo.attention.kv_quant``;
    # vLLM's names): the checkpoint's per-layer scales, set once the weights are loaded.
    k_scale: float = 1.0
    v_scale: float = 1.0
    # --calculate-kv-scales: the first keys and values the layer writes set k_scale/v_scale
    # instead (``maybe_calc_kv_scales``), once.
    calculate_kv_scales: bool = False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
    ) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of "
                             f"num_kv_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window

    def maybe_calc_kv_scales(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """vLLM's ``maybe_calc_kv_scales``: a backend calls it with the step's keys and
        values before writing them; the first that are not all zeros set the layer's
        scales (``kv_quant.calculated_scales``), which then stay."""
        if not self.calculate_kv_scales:
            return
        scales = calculated_scales(key, value)
        if scales is not None:
            self.k_scale, self.v_scale = scales
            self.calculate_kv_scales = False

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, num_heads, head_dim]
        key: torch.Tensor,  # [T, num_kv_heads, head_dim]
        value: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Write the step's new K/V into their slots (``metadata.slot_mapping``), then return
        every query token's attention over its request's context (module docstring)."""


@dataclass(frozen=True)
class MLADims:
    """One multi-head latent attention layer's sizes on this rank (``num_heads``: its share
    of the heads; the latent is whole on every rank)."""

    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


class MLAImpl(ABC):
    """One multi-head latent attention layer's computation (DeepSeek-V2), built by
    :meth:`AttentionBackend.make_mla_impl`. Its KV cache holds one latent row per token
    (``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]``: the normalised latent,
    then the rotated key part); ``kv_b_proj`` maps a latent to each head's key part without
    position (``qk_nope_head_dim``) and value (``v_head_dim``), heads one after another.
    Keys are ``[k_nope, k_pe]`` per head, ``k_pe`` shared by all heads."""

    def __init__(self, dims: MLADims, scale: float, kv_b_proj: torch.nn.Module) -> None:
        self.dims = dims
        self.scale = scale
        self.kv_b_proj = kv_b_proj

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj``'s weight as each head's key block ``[heads, qk_nope_head_dim,
        kv_lora_rank]`` and value block ``[heads, v_head_dim, kv_lora_rank]`` (views): what
        the absorbed form multiplies queries and latent outputs by."""
        dims = self.dims
        weight = self.kv_b_proj.weight
        assert isinstance(weight, torch.Tensor)
        weight = weight.view(dims.num_heads, -1, dims.kv_lora_rank)
        w_uk, w_uv = weight.split([dims.qk_nope_head_dim, dims.v_head_dim], dim=1)
        return w_uk, w_uv

    @abstractmethod
    def forward(
        self,
        q_nope: torch.Tensor,  # [T, heads, qk_nope_head_dim]
        q_pe: torch.Tensor,  # [T, heads, qk_rope_head_dim], rotated
        latent: torch.Tensor,  # [T, kv_lora_rank], normalised
        k_pe: torch.Tensor,  # [T, qk_rope_head_dim], rotated
        kv_cache: torch.Tensor,  # [num_blocks, block_size, latent_dim]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, heads, v_head_dim]
        """Write the step's latent rows into their slots, then return every query token's
        attention over its request's context, as the module docstring's contract says."""


class AttentionBackend(ABC):
    """A family of attention kernels, registered by name through
    ``octavo_register_attention_backends``. The contract is the module docstring's; the
    conformance kit (``octavo.testing.AttentionBackendContract``) checks a backend against a
    dense reference. The class is used, not instantiated: set ``name`` and ``impl_cls``."""

    name: ClassVar[str]
    impl_cls: ClassVar[type[AttentionImpl]]  # what make_impl builds, unless overridden
    supported_head_dims: ClassVar[tuple[int, ...] | None] = None  # None: any
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = None
    # Whether the backend attends ``AttentionMetadata.token_trees`` (tree speculation).
    supports_token_trees: ClassVar[bool] = False
    # Whether its impls soft-cap attention scores (``AttentionImpl.logits_soft_cap``).
    supports_logits_soft_cap: ClassVar[bool] = False
    # The --kv-cache-dtype values its impls read and write (auto: the model's dtype).
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    # What make_mla_impl builds; None: the backend has no latent attention.
    mla_impl_cls: ClassVar[type[MLAImpl] | None] = None

    @staticmethod
    def kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    @classmethod
    def make_impl(
        cls,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> AttentionImpl:
        """One layer's attention; backends that need more than the impl's constructor
        (workspace buffers, tuned launch parameters) override this. A soft cap is refused,
        naming the backend, unless it ``supports_logits_soft_cap``."""
        if logits_soft_cap is not None and not cls.supports_logits_soft_cap:
            raise ValueError(f"the {cls.name} attention backend does not soft-cap attention "
                             f"scores (attn_logit_softcapping={logits_soft_cap}); use "
                             "--attention-backend torch")
        impl = cls.impl_cls(num_heads, head_dim, scale, num_kv_heads, sliding_window)
        impl.logits_soft_cap = logits_soft_cap
        return impl

    @staticmethod
    def mla_kv_cache_shape(num_blocks: int, block_size: int, latent_dim: int,
                           ) -> tuple[int, ...]:
        """One latent attention layer's cache: a latent row per slot."""
        return (num_blocks, block_size, latent_dim)

    @classmethod
    def make_mla_impl(cls, dims: MLADims, scale: float, kv_b_proj: torch.nn.Module,
                      ) -> MLAImpl:
        """One latent attention layer's impl, refused (naming the backend) where it has
        none."""
        if cls.mla_impl_cls is None:
            raise ValueError(f"the {cls.name} attention backend has no multi-head latent "
                             "attention (MLA); use --attention-backend torch")
        return cls.mla_impl_cls(dims, scale, kv_b_proj)

    @staticmethod
    def move_kv(kv_cache: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor,
                ) -> None:
        """Copy the keys and values of ``src_slots`` to ``dst_slots`` (all sources are read
        before any destination is written); used to put accepted tree drafts in place.
        Backends with another cache layout override it."""
        rows = kv_cache.view(2, -1, kv_cache.shape[-2] * kv_cache.shape[-1])
        rows[:, dst_slots] = rows[:, src_slots]
