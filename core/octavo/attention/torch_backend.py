"""The portable paged-attention backend: pure PyTorch, runs on any CPU (and any torch device).

Each step it scatters the new keys/values into their cache slots, then computes attention
for every request of the flattened batch with ``scaled_dot_product_attention`` on 4-D
tensors (its fused kernels; 3-D inputs fall back to a much slower path):

- requests with one query token (decodes) together: their contexts are read through the
  block tables into one padded ``[batch, kv_heads, max_len, head_dim]`` tensor, and each
  key/value head's group of query heads is folded into the query length, so one call
  attends all of them with no repeated keys (``octavo.cpu.attention`` decodes bf16 with
  a fused kernel straight from the cache instead). A request with a few new tokens over a
  cached context (a speculative verification) joins them as one decode row per query
  token, each over the cache positions it may see;
- requests with several query tokens (a prompt or a chunk of one) in groups of consecutive
  requests with equal query and context lengths, one call per group, so no request is
  padded to the longest. A fresh prompt attends its own new keys directly; a chunk over a
  cached prefix reads its context from the cache. Query token ``j`` of a request with ``q``
  new tokens and ``s`` tokens of context sits at position ``s - q + j`` and sees the
  context up to and including itself;
- a query of a request verifying a speculative token tree, whatever its size, is a decode
  row too: over the cached context and, among the new tokens, its ancestors in the tree.

How the step's requests split into these groups, and which cache slots each one reads, is
the same in every layer: it is worked out once per step (``step_plan.StepPlan``) and kept in the
metadata's ``backend_state``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.base import AttentionBackend, AttentionImpl, AttentionMetadata
from octavo.attention.kv_quant import is_fp8, read_kv_fp8, round_trip, write_kv_fp8
from octavo.attention.step_plan import (
    DecodeBatch,
    PrefillGroup,
    StepPlan,
    decode_mask,
    prefill_mask,
    step_plan,
)
from octavo.attention.torch_mla import TorchMLAImpl
from octavo.config.cache import KV_CACHE_DTYPES


class TorchAttentionImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = metadata.num_actual_tokens
        self.maybe_calc_kv_scales(key[:num_tokens], value[:num_tokens])
        # [2, slots, kv_heads * head_dim]: a context read is one row gather for K and V.
        cache_rows = kv_cache.view(2, -1, self.num_kv_heads * self.head_dim)
        native = self._native(query, kv_cache)
        if native:
            self._write_kv_native(cache_rows, key[:num_tokens].flatten(1),
                                  value[:num_tokens].flatten(1),
                                  metadata.slot_mapping[:num_tokens])
        elif is_fp8(kv_cache.dtype):
            write_kv_fp8(cache_rows, key[:num_tokens].flatten(1), value[:num_tokens].flatten(1),
                         metadata.slot_mapping[:num_tokens], self.k_scale, self.v_scale)
        else:
            write_kv(kv_cache[0], kv_cache[1], key[:num_tokens], value[:num_tokens],
                     metadata.slot_mapping[:num_tokens])
        plan = step_plan(metadata, kv_cache.shape[2])
        decode = plan.decode
        if decode is not None and decode.tokens is None and query.shape[0] == num_tokens:
            return self._decode(query, cache_rows, decode, plan, native)
        # Tokens past num_actual_tokens (padding a runner may add) get zeros.
        output = torch.empty_like(query)
        output[num_tokens:].zero_()
        if decode is not None:
            tokens = decode.tokens
            if tokens is None:
                output[:len(decode.seq_lens)] = self._decode(
                    query[:len(decode.seq_lens)], cache_rows, decode, plan, native)
            else:
                output.index_copy_(0, tokens, self._decode(query.index_select(0, tokens),
                                                           cache_rows, decode, plan, native))
        if plan.prefills:
            self._prefill_groups(query, key, value, cache_rows, metadata, plan, output, native)
        return output

    def _prefill_groups(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        cache_rows: torch.Tensor, metadata: AttentionMetadata, plan: StepPlan,
                        output: torch.Tensor, native: bool) -> None:
        """The prefill groups' attention into their rows of ``output``, group by group; a
        device subclass with a fused prefill kernel overrides it."""
        del metadata, native
        for group in plan.prefills:
            end = group.start + group.num_reqs * group.query_len
            output[group.start:end] = self._prefill(query[group.start:end], key[group.start:end],
                                                    value[group.start:end], cache_rows, group,
                                                    plan)

    def _prefill(
        self,
        query: torch.Tensor,  # [n * q, heads, head_dim]
        key: torch.Tensor,  # [n * q, kv_heads, head_dim]: the group's new keys
        value: torch.Tensor,
        cache_rows: torch.Tensor,  # [2, slots, kv_heads * head_dim]
        group: PrefillGroup,
        plan: StepPlan,
    ) -> torch.Tensor:
        n, q_len, s_len = group.num_reqs, group.query_len, group.seq_len
        queries = query.view(n, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        if group.slots is None:  # fresh prompts: the context is exactly the new tokens
            if is_fp8(cache_rows.dtype):  # as stored, so a later chunk sees the same keys
                key = round_trip(key, self.k_scale, cache_rows.dtype)
                value = round_trip(value, self.v_scale, cache_rows.dtype)
            keys = key.view(n, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
            values = value.view(n, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        else:
            context = self._read_kv(cache_rows, group.slots, query.dtype).view(
                2, n, s_len, self.num_kv_heads, self.head_dim).transpose(2, 3)
            keys, values = context[0], context[1]
        mask = self._prefill_mask(q_len, s_len, query.device, plan)
        out = self._attention(queries, keys, values, mask, causal=mask is None)
        return out.transpose(1, 2).reshape(n * q_len, self.num_heads, self.head_dim)

    def _attention(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
        """SDPA over ``[n, heads, q, d]`` queries and ``[n, kv_heads, s, d]`` keys/values,
        ``mask`` bool ``[.., q, s]`` or ``causal``; with a soft cap, which SDPA lacks, the
        same product written out as HF's eager attention computes it."""
        if self.logits_soft_cap is None:
            return F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=mask, is_causal=causal, scale=self.scale,
                enable_gqa=queries.shape[1] != keys.shape[1])
        return soft_capped_attention(queries, keys, values, mask, causal, self.scale,
                                     self.logits_soft_cap)

    def _prefill_mask(self, query_len: int, seq_len: int, device: torch.device,
                      plan: StepPlan) -> torch.Tensor | None:
        return prefill_mask(query_len, seq_len, device, plan, self.sliding_window)

    def _native(self, query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        """Whether a fused kernel writes this layer's KV and decodes it. The portable backend
        has none; a device's subclass (``octavo.cpu.attention``) overrides this and the two
        ``_native`` methods below (and may override ``_prefill_groups``)."""
        del query, kv_cache
        return False

    def _write_kv_native(self, cache_rows: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, slots: torch.Tensor) -> None:
        """``write_kv`` by the fused kernel: ``cache_rows`` [2, slots, kv_heads * head_dim],
        ``keys`` / ``values`` [T, kv_heads * head_dim]."""
        raise NotImplementedError

    def _decode_native(self, query: torch.Tensor, cache_rows: torch.Tensor,
                       decode: DecodeBatch, plan: StepPlan) -> torch.Tensor:
        """The decode rows' attention by the fused kernel, straight from the cache."""
        raise NotImplementedError

    def _decode(self, query: torch.Tensor, cache_rows: torch.Tensor, decode: DecodeBatch,
                plan: StepPlan, native: bool) -> torch.Tensor:
        if native:
            return self._decode_native(query, cache_rows, decode, plan)
        return self._decode_sdpa(query, cache_rows, decode, plan)

    def _decode_sdpa(
        self,
        query: torch.Tensor,  # [B, heads, head_dim]: one token per request
        cache_rows: torch.Tensor,  # [2, slots, kv_heads * head_dim]
        decode: DecodeBatch,
        plan: StepPlan,
    ) -> torch.Tensor:
        """All single-token requests at once. Query heads ``h * group .. h * group + group -
        1`` share key/value head ``h``, so they become ``group`` query positions of head
        ``h``: no causal mask is needed (all sit at the same position), only padding."""
        batch = query.shape[0]
        group = self.num_heads // self.num_kv_heads
        context = self._read_kv(cache_rows, decode.slots, query.dtype).view(
            2, batch, decode.max_len, self.num_kv_heads, self.head_dim).transpose(2, 3)
        queries = query.view(batch, self.num_kv_heads, group, self.head_dim)
        out = self._attention(queries, context[0], context[1],
                              self._decode_mask(decode, plan), causal=False)
        return out.view(batch, self.num_heads, self.head_dim)

    def _decode_mask(self, decode: DecodeBatch, plan: StepPlan) -> torch.Tensor | None:
        return decode_mask(decode, plan, self.sliding_window)

    def _read_kv(self, cache_rows: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype,
                 ) -> torch.Tensor:
        """The keys and values of ``slots``, ``[2, len(slots), kv_heads * head_dim]`` in
        ``dtype``: an fp8 cache's dequantized with the layer's scales."""
        if is_fp8(cache_rows.dtype):
            return read_kv_fp8(cache_rows, slots, self.k_scale, self.v_scale, dtype)
        return cache_rows.index_select(1, slots)


def soft_capped_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          mask: torch.Tensor | None, causal: bool, scale: float, cap: float,
                          ) -> torch.Tensor:
    """Attention with scores ``cap * tanh(q.k * scale / cap)`` (Gemma 2), shapes and
    ``mask``/``causal`` as SDPA's (a bool mask is True where allowed), grouped-query heads
    included. Softmax in fp32, as HF's eager attention."""
    if keys.shape[1] != queries.shape[1]:
        group = queries.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
    scores = torch.matmul(queries, keys.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(queries.dtype)
    return torch.matmul(weights, values)


def write_kv(
    key_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    key: torch.Tensor,  # [T, kv_heads, head_dim]
    value: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    """Store each new token's key/value at its slot (block * block_size + offset)."""
    num_kv_heads, head_dim = key_cache.shape[2:]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    impl_cls = TorchAttentionImpl
    mla_impl_cls = TorchMLAImpl
    supports_token_trees = True
    supports_logits_soft_cap = True
    supported_kv_cache_dtypes = tuple(KV_CACHE_DTYPES)  # fp8: octavo.attention.kv_quant
