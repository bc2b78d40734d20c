"""``KVGroupAttention``: hands a layer's attention its KV group's metadata.

With several KV groups (sliding-window layers mixed with full-attention ones) each group
has its own block tables, and the step's metadata carries them all
(``AttentionMetadata.kv_groups``). The model runner wraps every layer's ``AttentionImpl``
in one of these when it allocates the KV cache, so neither the models (which pass the same
metadata to every layer) nor the backends (which read ``block_tables``/``slot_mapping``)
need to know about groups.
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.attention.base import AttentionImpl, AttentionMetadata


class KVGroupAttention(AttentionImpl):
    def __init__(self, impl: AttentionImpl, kv_group: int) -> None:
        # No AttentionImpl.__init__: every attribute but these comes from ``impl``.
        self.impl = impl
        self.kv_group = kv_group

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["impl"], name)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        if not metadata.kv_groups:
            raise ValueError(f"attention of KV group {self.kv_group} was given the metadata "
                             "of a step without KV groups")
        return self.impl.forward(query, key, value, kv_cache, metadata.kv_groups[self.kv_group])
