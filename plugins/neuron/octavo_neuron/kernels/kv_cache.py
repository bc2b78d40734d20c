"""Writing the new tokens' K/V into the paged cache by slot (``torch_backend.write_kv``).

The cache is viewed as rows of slots ([2, blocks * block_size, kv_heads * head_dim]); a tile
of 128 tokens is one indirect store whose partition index is the tile of their slots.
"""

from __future__ import annotations

import torch

from octavo_neuron.nki import nki, nl

from ._torch import PMAX


@nki.jit
def write_kv_kernel(key, value, kv_cache, slot_mapping):
    """``key``/``value`` [T, KVH, D] into ``kv_cache`` [2, blocks, block_size, KVH, D] at
    ``slot_mapping`` [T] (block * block_size + offset), in place."""
    num_tokens, kv_heads, head_dim = key.shape
    _, num_blocks, block_size, _, _ = kv_cache.shape
    width = kv_heads * head_dim
    slots_view = kv_cache.reshape((2, num_blocks * block_size, width))
    i_p = nl.arange(PMAX)[:, None]
    i_f = nl.arange(width)[None, :]
    for tile in nl.affine_range((num_tokens + PMAX - 1) // PMAX):
        rows = tile * PMAX + i_p
        valid = rows < num_tokens
        slots = nl.load(slot_mapping[rows], mask=valid)
        for side, src in enumerate((key, value)):
            new = nl.load(src.reshape((num_tokens, width))[rows, i_f], mask=valid)
            nl.store(slots_view[side, slots, i_f], new, mask=valid)


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store each token's key/value at its slot of ``kv_cache`` (modified in place)."""
    write_kv_kernel(key, value, kv_cache, slot_mapping.to(torch.int32))
