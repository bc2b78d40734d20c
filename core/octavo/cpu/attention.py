"""The CPU platform's attention backend: the portable torch backend, with the KV writes and
the decode rows of bf16 layers done by the fused C kernels (``octavo.cpu.kernels``) straight
from the paged cache. Prefill chunks, sliding windows and fp32 stay on the portable path,
which computes the same attention."""

from __future__ import annotations

import torch

from octavo.attention.torch_backend import DecodeBatch, TorchAttentionBackend, TorchAttentionImpl
from octavo.cpu import kernels


class CpuAttentionImpl(TorchAttentionImpl):
    def _native(self, query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        """bf16 on the CPU, no window, and the kernels built here."""
        return self.sliding_window is None and kernels.usable(query, kv_cache)

    def _write_kv_native(self, cache_rows: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, slots: torch.Tensor) -> None:
        kernels.write_kv(cache_rows, keys, values, slots)

    def _decode_native(self, query: torch.Tensor, cache_rows: torch.Tensor,
                       decode: DecodeBatch) -> torch.Tensor:
        return kernels.decode_attention(query, cache_rows, decode.slots,
                                        decode.seq_lens.view(-1), decode.max_len,
                                        self.num_kv_heads, self.scale)


class CpuAttentionBackend(TorchAttentionBackend):
    name = "cpu"
    impl_cls = CpuAttentionImpl
