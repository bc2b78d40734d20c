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

from octavo.plugin_api import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    MLADims,
    MLAImpl,
)
from octavo_triton.interpret import interpreting, patch_interpreter

# Cache blocks are the attention kernel's key tiles: a power of two, and tl.dot needs >= 16.
SUPPORTED_BLOCK_SIZES = (16, 32, 64, 128)


def check_device() -> None:
    """Models are built under ``torch.device(device)``: refuse a CPU model at once, with
    what to do, rather than at its first step."""
    if torch.get_default_device().type == "cpu":
        if not interpreting():
            raise ValueError(
                "the triton attention backend runs on the CPU only under Triton's "
                "interpreter: start Octavo with TRITON_INTERPRET=1 in the environment "
                "(or use --attention-backend torch)")
        patch_interpreter()


def check_block_size(block_size: int) -> None:
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"the triton attention backend needs a block size in "
                         f"{SUPPORTED_BLOCK_SIZES}; got {block_size} (--block-size)")


class TritonAttentionImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int,
                 sliding_window: int | None = None) -> None:
        super().__init__(num_heads, head_dim, scale, num_kv_heads, sliding_window)
        check_device()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        check_block_size(kv_cache.shape[2])
        from octavo_triton.kernels.attention import paged_attention
        from octavo_triton.kernels.kv_cache import reshape_and_cache

        num_tokens = metadata.num_actual_tokens
        self.maybe_calc_kv_scales(key[:num_tokens], value[:num_tokens])
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        reshape_and_cache(key[:num_tokens], value[:num_tokens], key_cache, value_cache,
                          metadata.slot_mapping[:num_tokens], self.k_scale, self.v_scale)
        output = torch.empty_like(query)
        output[num_tokens:] = 0  # padding tokens a runner may add get zeros
        paged_attention(output, query, key_cache, value_cache, metadata, self.scale,
                        self.sliding_window, self.k_scale, self.v_scale)
        return output


class TritonMLAImpl(MLAImpl):
    """Latent attention (DeepSeek-V2) on the paged attention kernel, every token in the
    absorbed form: queries times each head's key block of ``kv_b_proj`` are queries in
    latent space, attended as one key head over the cache's latent rows, those rows the
    values too (the output's first ``kv_lora_rank`` values are the latent sum); that times
    each head's value block is the output. One launch serves prompt chunks and decodes, as
    for other models; the latent rows are written with one index copy."""

    def __init__(self, dims: MLADims, scale: float, kv_b_proj: torch.nn.Module) -> None:
        super().__init__(dims, scale, kv_b_proj)
        check_device()

    def forward(self, q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor,
                k_pe: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                ) -> torch.Tensor:
        check_block_size(kv_cache.shape[1])
        from octavo_triton.kernels.attention import paged_attention

        dims, num_tokens = self.dims, metadata.num_actual_tokens
        rows = kv_cache.view(-1, dims.latent_dim)
        rows.index_copy_(0, metadata.slot_mapping[:num_tokens],
                         torch.cat([latent, k_pe], dim=-1)[:num_tokens])
        w_uk, w_uv = self.absorbed_weights()
        queries = torch.cat([torch.einsum("thn,hnc->thc", q_nope, w_uk), q_pe], dim=-1)
        out = torch.zeros_like(queries)  # padding tokens a runner may add get zeros
        latent_cache = kv_cache.view(*kv_cache.shape[:2], 1, dims.latent_dim)
        paged_attention(out, queries.contiguous(), latent_cache, latent_cache, metadata,
                        self.scale)
        return torch.einsum("thc,hvc->thv", out[..., :dims.kv_lora_rank], w_uv)


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    impl_cls = TritonAttentionImpl
    mla_impl_cls = TritonMLAImpl
    supported_block_sizes = SUPPORTED_BLOCK_SIZES
    # An fp8 cache holds value / scale (``AttentionImpl.k_scale`` / ``v_scale``, the
    # checkpoint's or 1.0); both kernels take it (kernels/kv_cache.py, kernels/attention.py).
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
