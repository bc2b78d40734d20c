"""Multi-head latent attention (DeepSeek-V2) on the portable backend: ``TorchMLAImpl``.

The cache holds one latent row per token (``MLAImpl``). The step is split as the torch
backend splits any step (``StepPlan``): prompt chunks in groups, single-token requests
together as decode rows. Each kind computes the same attention its own way:

- prompt chunks expand the latent, as HF does: each context row through ``kv_b_proj``
  gives every head's key part and value, the shared rotated key part is appended, and
  ``scaled_dot_product_attention`` attends as for any model. The expansion costs
  ``context x kv_lora_rank x heads x (nope + v)`` multiply-adds, which a chunk's own
  queries amortise;
- decode rows absorb ``kv_b_proj`` into the query and the output instead (DeepSeek's
  "absorbed" form): ``q_nope`` times each head's key block gives a query in latent space,
  so scores are ``[q_latent, q_pe] . [latent, k_pe]`` - one key head of ``latent_dim``
  shared by all heads, read straight from the cache - and the weighted sum of latents
  times each head's value block is the output. Per step that reads each context row once
  and multiplies it by nothing, where expanding would project the whole context again for
  one token (``benchmarks/mla_decode.py`` times both; ``absorbed_decode`` chooses).

Attention over latents with the latent as its own value is plain multi-query attention
with ``values = keys`` (the output's first ``kv_lora_rank`` values are the latent sum,
the rest is dropped): a device subclass runs it on its own decode kernel
(``_latent_decode``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.base import AttentionMetadata, MLAImpl
from octavo.attention.step_plan import DecodeBatch, PrefillGroup, StepPlan, step_plan
from octavo.attention.step_plan import decode_mask as padding_mask
from octavo.attention.step_plan import prefill_mask as causal_mask


class TorchMLAImpl(MLAImpl):
    # Decode rows in the absorbed form (else expanded like prompt chunks). At DeepSeek-V2-
    # Lite's shapes on the CPU, bf16, one thread, 2 layers over 256 tokens of context
    # (benchmarks/mla_decode.py, a busy machine): 9.3 against 15.0 ms a step for one row,
    # 14.1 against 176 ms for four (the expansion grows with the rows' contexts).
    absorbed_decode: bool = True

    def forward(self, q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor,
                k_pe: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                ) -> torch.Tensor:
        num_tokens = metadata.num_actual_tokens
        rows = kv_cache.view(-1, self.dims.latent_dim)  # [slots, latent_dim]
        new_rows = torch.cat([latent, k_pe], dim=-1)
        self._write(rows, new_rows[:num_tokens], metadata.slot_mapping[:num_tokens])
        plan = step_plan(metadata, kv_cache.shape[1])
        output = q_nope.new_zeros(q_nope.shape[0], self.dims.num_heads, self.dims.v_head_dim)
        decode = plan.decode
        if decode is not None:
            tokens = (torch.arange(len(decode.seq_lens), device=q_nope.device)
                      if decode.tokens is None else decode.tokens)
            output.index_copy_(0, tokens, self._decode(q_nope.index_select(0, tokens),
                                                       q_pe.index_select(0, tokens), rows,
                                                       decode, plan))
        for group in plan.prefills:
            end = group.start + group.num_reqs * group.query_len
            output[group.start:end] = self._prefill(q_nope[group.start:end],
                                                    q_pe[group.start:end],
                                                    new_rows[group.start:end], rows, group,
                                                    plan)
        return output

    def _write(self, rows: torch.Tensor, new_rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Store each new token's latent row at its slot."""
        rows.index_copy_(0, slots, new_rows)

    # -- expanded: prompt chunks (and decode rows with absorbed_decode off) -----------------

    def _expanded(self, q_nope: torch.Tensor, q_pe: torch.Tensor, context: torch.Tensor,
                  mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of ``[n, q, heads, ...]`` queries over ``[n, s, latent_dim]`` context
        rows expanded to each head's keys and values; ``mask`` ``[.., q, s]`` (None:
        causal). Returns ``[n, q, heads, v_head_dim]``."""
        dims = self.dims
        n, s = context.shape[:2]
        latent, k_pe = context.split([dims.kv_lora_rank, dims.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(latent.reshape(n * s, -1)).view(n, s, dims.num_heads, -1)
        k_nope, values = kv.split([dims.qk_nope_head_dim, dims.v_head_dim], dim=-1)
        keys = torch.cat([k_nope, k_pe[:, :, None, :].expand(-1, -1, dims.num_heads, -1)],
                         dim=-1)
        queries = torch.cat([q_nope, q_pe], dim=-1)
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask, is_causal=mask is None, scale=self.scale)
        return out.transpose(1, 2)

    def _prefill(self, q_nope: torch.Tensor, q_pe: torch.Tensor, new_rows: torch.Tensor,
                 rows: torch.Tensor, group: PrefillGroup, plan: StepPlan) -> torch.Tensor:
        """One prefill group's attention ``[n * q, heads, v_head_dim]``; ``new_rows``: its
        tokens' latent rows."""
        n, q_len, s_len = group.num_reqs, group.query_len, group.seq_len
        if group.slots is None:  # fresh prompts: the context is exactly their new rows
            context = new_rows.view(n, q_len, -1)
        else:
            context = rows.index_select(0, group.slots).view(n, s_len, -1)
        heads, nope = self.dims.num_heads, self.dims.qk_nope_head_dim
        out = self._expanded(q_nope.view(n, q_len, heads, nope),
                             q_pe.view(n, q_len, heads, -1), context,
                             causal_mask(q_len, s_len, rows.device, plan))
        return out.reshape(n * q_len, heads, -1)

    # -- decode rows ------------------------------------------------------------------------

    def _decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, rows: torch.Tensor,
                decode: DecodeBatch, plan: StepPlan) -> torch.Tensor:
        """``[B, heads, v_head_dim]`` for one query token per decode row."""
        if not self.absorbed_decode:
            context = rows.index_select(0, decode.slots).view(len(q_nope), decode.max_len, -1)
            mask = padding_mask(decode, plan)
            if mask is None:
                mask = torch.ones(1, 1, 1, decode.max_len, dtype=torch.bool,
                                  device=rows.device)
            return self._expanded(q_nope[:, None], q_pe[:, None], context, mask)[:, 0]
        w_uk, w_uv = self.absorbed_weights()
        q_latent = torch.einsum("bhn,hnc->bhc", q_nope, w_uk)
        queries = torch.cat([q_latent, q_pe], dim=-1)  # [B, heads, latent_dim]
        out = self._latent_decode(queries, rows, decode, plan)
        return torch.einsum("bhc,hvc->bhv", out[..., :self.dims.kv_lora_rank], w_uv)

    def _latent_decode(self, queries: torch.Tensor, rows: torch.Tensor, decode: DecodeBatch,
                       plan: StepPlan) -> torch.Tensor:
        """Multi-query attention of ``queries [B, heads, latent_dim]`` over each row's
        latent context, the latent rows as keys and values: ``[B, heads, latent_dim]``."""
        batch = len(queries)
        context = rows.index_select(0, decode.slots).view(batch, 1, decode.max_len, -1)
        out = F.scaled_dot_product_attention(queries[:, None], context, context,
                                             attn_mask=padding_mask(decode, plan),
                                             scale=self.scale)
        return out[:, 0]
