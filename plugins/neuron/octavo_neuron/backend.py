"""``NkiAttentionBackend`` (``nki``): the attention backend of the Neuron platform, on the
NKI kernels of :mod:`octavo_neuron.kernels` - ``write_kv`` stores the step's K/V in the
cache, then ``paged_attention`` attends the whole mixed batch (decodes, prompts, chunks
over a cached prefix) through the block tables.

The request layout is read from the metadata's host copies: the kernel takes query starts
and sequence lengths as compile-time constants, as a traced Neuron graph would.
Off a Neuron host the kernels run in the numpy emulator (``OCTAVO_NEURON_EMULATE=1``).
"""

from __future__ import annotations

import torch

from octavo.plugin_api import AttentionBackend, AttentionImpl, AttentionMetadata
from octavo_neuron.kernels import paged_attention, write_kv
from octavo_neuron.kernels._torch import PMAX


class NkiAttentionImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int,
                 sliding_window: int | None = None) -> None:
        super().__init__(num_heads, head_dim, scale, num_kv_heads, sliding_window)
        # The kernel puts the head dimension on the partitions of q^T and k^T.
        if head_dim > PMAX:
            raise ValueError(f"the nki attention backend needs head_dim <= {PMAX} (the "
                             f"partitions of a tile); got {head_dim}")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens, num_reqs = metadata.num_actual_tokens, metadata.num_reqs
        write_kv(kv_cache, key[:num_tokens], value[:num_tokens],
                 metadata.slot_mapping[:num_tokens])
        starts = _host(metadata.query_start_loc_cpu, metadata.query_start_loc)[:num_reqs + 1]
        seq_lens = _host(metadata.seq_lens_cpu, metadata.seq_lens)[:num_reqs]
        output = query.new_zeros(query.shape)  # padding tokens a runner may add get zeros
        output[:num_tokens] = paged_attention(query, kv_cache, metadata.block_tables[:num_reqs],
                                              starts, seq_lens, self.scale,
                                              self.sliding_window)
        return output


def _host(host_copy: torch.Tensor | None, device_tensor: torch.Tensor) -> torch.Tensor:
    """The metadata's host copy; a copy of the device tensor where a caller gave none."""
    return device_tensor.cpu() if host_copy is None else host_copy


class NkiAttentionBackend(AttentionBackend):
    name = "nki"
    impl_cls = NkiAttentionImpl
