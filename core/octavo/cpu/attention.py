"""The CPU platform's attention backend: the portable torch backend, with the bf16 layers'
attention done by the fused C kernels (``octavo.cpu.kernels``) straight from the paged cache:

- the KV writes, and the decode rows (one query token, or a few over a cached context);
- prompt chunks, all of a step's in one call (with AVX512-BF16 and a head size a multiple
  of 16): keys and values packed once per request and kv head, both products on the pair
  GEMM's tiles, causal within each chunk;
- cascade attention for decode rows that share a long prefix (many requests after one
  system prompt, W3): the shared positions are attended once for every row together, as
  one prompt-sized product, and each row's own positions by the decode kernel, which
  merges the two (FlashInfer's and vLLM's cascade attention).

An fp8 KV cache (``--kv-cache-dtype fp8``) is written and decoded by its own kernels
(``octavo.cpu.kv_fp8``); its prompt chunks take the portable path, which dequantizes
their context. Sliding windows, soft-capped scores and fp32 stay on the portable path,
which computes the same attention. Latent attention (``CpuMLAImpl``) decodes on the
same decode kernel, its latent rows serving as keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.attention.base import AttentionMetadata
from octavo.attention.kv_quant import is_fp8
from octavo.attention.step_plan import DecodeBatch, StepPlan, context_slots
from octavo.attention.torch_backend import TorchAttentionBackend, TorchAttentionImpl
from octavo.attention.torch_mla import TorchMLAImpl
from octavo.cpu import kernels, kv_fp8

# Cascade attention pays off when many rows share a long prefix: it replaces one pass over
# the prefix per row by one product of all rows (vLLM's thresholds: 256 shared tokens).
CASCADE_MIN_ROWS = 8
CASCADE_MIN_PREFIX = 256


@dataclass
class PrefillRequests:
    """A step's prompt chunks as the prefill kernel takes them (int64 tensors)."""

    query_start: torch.Tensor  # [R]: first row of each chunk in the flat batch
    query_lens: torch.Tensor  # [R]
    seq_lens: torch.Tensor  # [R]: context length after the chunk
    slots: torch.Tensor  # [R, max context]: cache slot of each context position


@dataclass
class SharedPrefix:
    """The positions every decode row of a step sees first, and what follows for each."""

    slots: torch.Tensor  # [P]: the shared positions' cache slots
    suffix: DecodeBatch  # each row's own positions after them


def prefill_requests(metadata: AttentionMetadata, plan: StepPlan) -> PrefillRequests:
    """Every request of the plan's prefill groups, with its context's cache slots."""
    starts = metadata.query_start_loc_cpu
    if starts is None:  # prepare_step fills the host copy; callers of their own may not
        starts = metadata.query_start_loc.cpu()
    row_of_token = {int(start): row for row, start in enumerate(starts[:-1].tolist())}
    first, lens, seqs, rows = [], [], [], []
    for group in plan.prefills:
        for i in range(group.num_reqs):
            start = group.start + i * group.query_len
            first.append(start)
            lens.append(group.query_len)
            seqs.append(group.seq_len)
            rows.append(row_of_token[start])
    tables = metadata.block_tables[torch.tensor(rows)]
    max_ctx = max(seqs)
    return PrefillRequests(torch.tensor(first), torch.tensor(lens), torch.tensor(seqs),
                           context_slots(tables, max_ctx, plan.block_size).view(len(rows),
                                                                                max_ctx))


def shared_prefix(decode: DecodeBatch) -> SharedPrefix | None:
    """The longest run of leading positions whose slots every decode row shares (leaving
    each row at least one position of its own), when cascade attention pays off."""
    rows = len(decode.seq_lens)
    if rows < CASCADE_MIN_ROWS:
        return None
    slots = decode.slots.view(rows, decode.max_len)
    shortest = int(decode.seq_lens.min())
    same = (slots[:, :shortest - 1] == slots[:1, :shortest - 1]).all(0)
    length = int(same.long().cumprod(0).sum())
    if length < CASCADE_MIN_PREFIX:
        return None
    return SharedPrefix(slots[0, :length].contiguous(), DecodeBatch(
        tokens=decode.tokens, slots=slots[:, length:].contiguous().flatten(),
        seq_lens=decode.seq_lens - length, max_len=decode.max_len - length,
        equal_lens=decode.equal_lens))


def decode_rows(decode: DecodeBatch, plan: StepPlan, head_dim: int, cache_rows: torch.Tensor,
                ) -> tuple[DecodeBatch, SharedPrefix | None]:
    """What the decode kernel attends - the decode rows, or with a shared prefix worth
    cascade attention what follows it - and that prefix (worked out once per step)."""
    if "shared_prefix" not in plan.native:
        plan.native["shared_prefix"] = (shared_prefix(decode)
                                        if kernels.attention_available(head_dim, cache_rows)
                                        else None)
    prefix = plan.native["shared_prefix"]
    return (decode, None) if prefix is None else (prefix.suffix, prefix)


class CpuAttentionImpl(TorchAttentionImpl):
    def _native(self, query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        """bf16 on the CPU (its cache bf16 or fp8), no window, no soft cap, and the kernels
        built here."""
        return (self.sliding_window is None and self.logits_soft_cap is None
                and (kernels.usable(query, kv_cache) or kv_fp8.usable(query, kv_cache)))

    def _write_kv_native(self, cache_rows: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, slots: torch.Tensor) -> None:
        if is_fp8(cache_rows.dtype):
            kv_fp8.write_kv_fp8(cache_rows, keys, values, slots, self.k_scale, self.v_scale)
        else:
            kernels.write_kv(cache_rows, keys, values, slots)

    def _decode_native(self, query: torch.Tensor, cache_rows: torch.Tensor,
                       decode: DecodeBatch, plan: StepPlan) -> torch.Tensor:
        if is_fp8(cache_rows.dtype):  # no cascade: the prefix kernel reads bf16 only
            return kv_fp8.decode_attention_fp8(
                query, cache_rows, decode.slots, decode.seq_lens.view(-1), decode.max_len,
                self.num_kv_heads, self.scale, self.k_scale, self.v_scale)
        rows, prefix = decode_rows(decode, plan, self.head_dim, cache_rows)
        state = None if prefix is None else kernels.prefix_attention(
            query, cache_rows, prefix.slots, self.num_kv_heads, self.scale)
        return kernels.decode_attention(query, cache_rows, rows.slots, rows.seq_lens.view(-1),
                                        rows.max_len, self.num_kv_heads, self.scale, state)

    def _prefill_groups(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        cache_rows: torch.Tensor, metadata: AttentionMetadata, plan: StepPlan,
                        output: torch.Tensor, native: bool) -> None:
        """Every prompt chunk of the step in one kernel call, over the cache (their keys
        and values are already written there)."""
        if not (native and not is_fp8(cache_rows.dtype)
                and kernels.attention_available(self.head_dim, cache_rows)):
            super()._prefill_groups(query, key, value, cache_rows, metadata, plan, output,
                                    native)
            return
        if "prefills" not in plan.native:
            plan.native["prefills"] = prefill_requests(metadata, plan)
        chunks = plan.native["prefills"]
        kernels.prefill_attention(output, query, cache_rows, chunks.slots, chunks.query_start,
                                  chunks.query_lens, chunks.seq_lens, self.num_kv_heads,
                                  self.scale)


class CpuMLAImpl(TorchMLAImpl):
    """bf16 latent attention with the decode rows on the fused decode kernel: multi-query
    attention over the latent rows as keys and values (``TorchMLAImpl``'s docstring)."""

    def _latent_decode(self, queries: torch.Tensor, rows: torch.Tensor, decode: DecodeBatch,
                       plan: StepPlan) -> torch.Tensor:
        if not kernels.usable(queries, rows):
            return super()._latent_decode(queries, rows, decode, plan)
        return kernels.decode_attention(queries.contiguous(), rows, decode.slots,
                                        decode.seq_lens.view(-1).contiguous(), decode.max_len,
                                        1, self.scale, values_are_keys=True)


class CpuAttentionBackend(TorchAttentionBackend):
    name = "cpu"
    impl_cls = CpuAttentionImpl
    mla_impl_cls = CpuMLAImpl
