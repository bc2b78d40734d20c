"""Attention without a KV cache, for full-sequence forwards during training.

Training runs whole sequences at once - the target to read its features, the EAGLE head to
learn from them - with gradients through the head. Its ``AttentionImpl`` attends causally
within each request of the flattened batch and never touches a cache, so the same model
and head classes the engine uses train and extract features unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.plugin_api import AttentionBackend, AttentionImpl, AttentionMetadata


class DenseCausalAttentionImpl(AttentionImpl):
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        del kv_cache  # full sequences: every key is in this step
        assert metadata.query_start_loc_cpu is not None
        starts = metadata.query_start_loc_cpu.tolist()
        outputs = []
        for start, end in zip(starts, starts[1:]):
            q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads)
            outputs.append(out.transpose(0, 1))
        return torch.cat(outputs)


class DenseCausalBackend(AttentionBackend):
    name = "dense-causal"
    impl_cls = DenseCausalAttentionImpl


def full_sequence_metadata(lengths: list[int], device: torch.device) -> AttentionMetadata:
    """Metadata for whole sequences laid back to back (no cache, no slots)."""
    ends = torch.tensor(lengths).cumsum(0)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), ends]).to(torch.int32)
    lens = torch.tensor(lengths, dtype=torch.int32)
    return AttentionMetadata(
        num_actual_tokens=int(ends[-1]), num_reqs=len(lengths),
        query_start_loc=starts.to(device), seq_lens=lens.to(device),
        block_tables=torch.zeros((len(lengths), 0), dtype=torch.int32, device=device),
        slot_mapping=torch.zeros(0, dtype=torch.int64, device=device),
        max_query_len=max(lengths), max_seq_len=max(lengths),
        query_start_loc_cpu=starts, seq_lens_cpu=lens)
