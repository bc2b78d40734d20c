"""``TritonAttentionBackend``: the ``AttentionBackend`` of the GPU platforms, on the kernels
of :mod:`octavo_triton.kernels` - one launch writes the step's K/V into the cache, the next
computes attention for the whole mixed batch (see ``kernels/attention.py``).

It launches no host synchronisation and reads only the integer fields of the metadata on
the host, so a forward pass through it can be captured in a CUDA graph.

On the CPU it runs under Triton's interpreter, which must be switched on with
``TRITON_INTERPRET=1`` before Octavo starts (``--attention-backend triton`` on the CPU
platform): the whole engine then runs on these kernels, slowly, for testing.
"""

from __future__ import annotations

import torch

from octavo.plugin_api import AttentionBackend, AttentionImpl, AttentionMetadata
from octavo_triton.interpret import interpreting, patch_interpreter

# Cache blocks are the attention kernel's key tiles: a power of two, and tl.dot needs >= 16.
SUPPORTED_BLOCK_SIZES = (16, 32, 64, 128)


class TritonAttentionImpl(AttentionImpl):
    # Scales of an fp8 KV cache (stored value = value / scale); unused for other dtypes.
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int,
                 sliding_window: int | None = None) -> None:
        super().__init__(num_heads, head_dim, scale, num_kv_heads, sliding_window)
        # Models are built under ``torch.device(device)``: refuse a CPU model at once, with
        # what to do, rather than at its first step.
        if torch.get_default_device().type == "cpu":
            if not interpreting():
                raise ValueError(
                    "the triton attention backend runs on the CPU only under Triton's "
                    "interpreter: start Octavo with TRITON_INTERPRET=1 in the environment "
                    "(or use --attention-backend torch)")
            patch_interpreter()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        block_size = kv_cache.shape[2]
        if block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(f"the triton attention backend needs a block size in "
                             f"{SUPPORTED_BLOCK_SIZES}; got {block_size} (--block-size)")
        from octavo_triton.kernels.attention import paged_attention
        from octavo_triton.kernels.kv_cache import reshape_and_cache

        num_tokens = metadata.num_actual_tokens
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        reshape_and_cache(key[:num_tokens], value[:num_tokens], key_cache, value_cache,
                          metadata.slot_mapping[:num_tokens], self.k_scale, self.v_scale)
        output = torch.empty_like(query)
        output[num_tokens:] = 0  # padding tokens a runner may add get zeros
        paged_attention(output, query, key_cache, value_cache, metadata, self.scale,
                        self.sliding_window, self.k_scale, self.v_scale)
        return output


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    impl_cls = TritonAttentionImpl
    supported_block_sizes = SUPPORTED_BLOCK_SIZES
