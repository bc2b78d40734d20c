"""The portable paged-attention backend: pure PyTorch, runs on any CPU (and any torch device).

Each step it scatters the new keys/values into their cache slots, then computes attention
for every request of the flattened batch:

- requests with one query token (decodes) together: their context is gathered through the
  block tables into one padded tensor and attended with a single batched matmul, the hot
  path of generation;
- every other request (a prompt or a chunk of one) on its own with
  ``scaled_dot_product_attention`` over exactly its context, so no request is padded to the
  longest. Query token ``j`` of a request with ``q`` new tokens and ``s`` tokens of context
  sits at position ``s - q + j`` and sees the context up to and including itself, which is
  what lets a chunk attend to the prefix already in the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.base import AttentionBackend, AttentionImpl, AttentionMetadata


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
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        write_kv(key_cache, value_cache, key[:num_tokens], value[:num_tokens],
                 metadata.slot_mapping[:num_tokens])

        # Tokens past num_actual_tokens (padding a runner may add) get zeros.
        output = torch.zeros_like(query)
        num_reqs = metadata.num_reqs
        starts = _host(metadata.query_start_loc_cpu, metadata.query_start_loc)[
            :num_reqs + 1].tolist()
        seq_lens = _host(metadata.seq_lens_cpu, metadata.seq_lens)[:num_reqs].tolist()
        query_lens = [end - start for start, end in zip(starts, starts[1:])]
        decodes = [row for row, length in enumerate(query_lens) if length == 1]
        if decodes:
            tokens = torch.tensor([starts[row] for row in decodes], device=query.device)
            output[tokens] = self._decode(query[tokens], key_cache, value_cache,
                                          metadata.block_tables[decodes],
                                          [seq_lens[row] for row in decodes])
        for row, length in enumerate(query_lens):
            if length > 1:
                start = starts[row]
                output[start:start + length] = self._prefill(
                    query[start:start + length], key_cache, value_cache,
                    metadata.block_tables[row], seq_lens[row])
        return output

    def _prefill(
        self,
        query: torch.Tensor,  # [q, heads, head_dim]
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,  # [max_blocks]
        seq_len: int,
    ) -> torch.Tensor:
        """One request's chunk of ``q`` tokens against its context (cached prefix + chunk)."""
        query_len = query.shape[0]
        # With a window, keys before the first query token's window are never looked at.
        first_key = 0
        if self.sliding_window is not None:
            first_key = max(0, seq_len - query_len - self.sliding_window + 1)
        keys = gather_context(key_cache, block_table, first_key, seq_len)
        values = gather_context(value_cache, block_table, first_key, seq_len)
        num_keys = seq_len - first_key

        window_cuts = self.sliding_window is not None and query_len > self.sliding_window
        is_causal = query_len == num_keys and not window_cuts
        mask = None
        if not is_causal:
            mask = self._mask(torch.arange(seq_len - query_len, seq_len, device=query.device),
                              torch.arange(first_key, seq_len, device=query.device))
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=mask, is_causal=is_causal, scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out.transpose(0, 1)

    def _mask(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """``[q, k]`` True where the query at ``query_pos`` may attend the key at ``key_pos``."""
        allowed = key_pos[None, :] <= query_pos[:, None]
        if self.sliding_window is not None:
            allowed &= key_pos[None, :] > query_pos[:, None] - self.sliding_window
        return allowed

    def _decode(
        self,
        query: torch.Tensor,  # [batch, heads, head_dim]: one token per request
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [batch, max_blocks]
        seq_lens: list[int],
    ) -> torch.Tensor:
        """All single-token requests at once: gather each one's blocks into a padded
        ``[batch, max_seq_len]`` context, mask the padding, one grouped matmul."""
        batch = query.shape[0]
        block_size = key_cache.shape[1]
        max_len = max(seq_lens)
        blocks = block_tables[:, :-(-max_len // block_size)]
        # [batch, kv_heads, tokens, head_dim]
        keys = key_cache[blocks].flatten(1, 2)[:, :max_len].transpose(1, 2)
        values = value_cache[blocks].flatten(1, 2)[:, :max_len].transpose(1, 2)

        # Query heads h * group ... h * group + group - 1 share key/value head h.
        group = self.num_heads // self.num_kv_heads
        grouped = query.view(batch, self.num_kv_heads, group, self.head_dim)
        scores = torch.matmul(grouped, keys.transpose(2, 3)).float() * self.scale

        lens = torch.tensor(seq_lens, device=query.device)[:, None]
        key_pos = torch.arange(max_len, device=query.device)[None, :]
        allowed = key_pos < lens
        if self.sliding_window is not None:
            allowed &= key_pos >= lens - self.sliding_window
        scores.masked_fill_(~allowed[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(query.dtype)
        return torch.matmul(probs, values).view(batch, self.num_heads, self.head_dim)


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


def gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, start: int, end: int
) -> torch.Tensor:
    """Tokens ``start:end`` of one request's context, ``[end - start, kv_heads, head_dim]``,
    read through its block table (only the blocks that hold them)."""
    block_size = cache.shape[1]
    first_block = start // block_size
    last_block = -(-end // block_size)
    tokens = cache[block_table[first_block:last_block]].flatten(0, 1)
    offset = first_block * block_size
    return tokens[start - offset:end - offset]


def _host(host_copy: torch.Tensor | None, device_tensor: torch.Tensor) -> torch.Tensor:
    return device_tensor.cpu() if host_copy is None else host_copy


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    impl_cls = TorchAttentionImpl
