"""Attention for EAGLE-3's training-time test: k drafting steps unrolled over whole sequences.

At inference, the head's j-th chained draft from the last verified position ``p`` attends the
cache entries of the real context ``0..p`` and the ``j`` entries its own chain wrote after
it. Training runs step ``j`` over every position ``p`` of the sequences at once, so the
attention of step ``j`` lets the query at ``p`` see step 0's keys at ``0..p`` (causal) and,
at ``p`` only, the keys steps ``1..j`` made there - exactly what that draft would have seen.
The impl keeps each step's keys and values until ``reset`` (gradients flow through them), so
the head's own ``LlamaAttention`` trains unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.plugin_api import AttentionBackend, AttentionImpl, AttentionMetadata


class TrainingTimeTestImpl(AttentionImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # each step's keys, values

    def reset(self) -> None:
        """Forget the steps of the last unrolled batch."""
        self.steps = []

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        del kv_cache  # whole sequences: every key is in ``steps``
        assert metadata.query_start_loc_cpu is not None
        self.steps.append((key, value))
        starts = metadata.query_start_loc_cpu.tolist()
        outputs = []
        for start, end in zip(starts, starts[1:]):
            q = query[start:end].transpose(0, 1)  # [heads, n, d]
            keys = torch.cat([k[start:end] for k, _ in self.steps]).transpose(0, 1)
            values = torch.cat([v[start:end] for _, v in self.steps]).transpose(0, 1)
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=step_mask(end - start, len(self.steps), q.device),
                scale=self.scale, enable_gqa=self.num_heads != self.num_kv_heads)
            outputs.append(out.transpose(0, 1))
        return torch.cat(outputs)


def step_mask(length: int, num_steps: int, device: torch.device) -> torch.Tensor:
    """bool ``[length, num_steps * length]``: causal over step 0's keys, the diagonal of
    every later step's."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * (num_steps - 1), dim=1)


class TrainingTimeTestBackend(AttentionBackend):
    name = "training-time-test"
    impl_cls = TrainingTimeTestImpl
