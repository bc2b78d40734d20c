"""The shapes the TPU model runner compiles the kernels for: its token and sequence buckets
crossed with the head layouts it serves. The lowering test exports every kernel for each entry
(``jax.export`` with ``platforms=["tpu"]``), so a shape the runner can hit never first fails on
the device. Keep the list short: every entry costs a Mosaic lowering in CI."""

from __future__ import annotations

from dataclasses import dataclass

# Padded query-token counts per step and padded sequence counts: powers of two, as the
# runner's buckets (octavo_tpu.buckets: tokens from 8, requests from 1).
TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512)
SEQ_BUCKETS = (1, 8, 16, 32, 64)
PAGE_SIZE = 16


@dataclass(frozen=True)
class KernelShape:
    """One compiled instance of the attention and KV-write kernels."""

    num_tokens: int
    max_num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    page_size: int = PAGE_SIZE
    pages_per_seq: int = 128  # 2048-token contexts
    num_pages: int = 1024


KERNEL_SHAPES: tuple[KernelShape, ...] = (
    # SmolLM2-135M (the default model): 9 q heads over 3 kv heads, head_dim 64.
    # Each token bucket with a sequence bucket (1, 8, 16, 32, then 64 for the rest).
    *(KernelShape(t, SEQ_BUCKETS[min(i, len(SEQ_BUCKETS) - 1)], 9, 3, 64)
      for i, t in enumerate(TOKEN_BUCKETS)),
    KernelShape(16, 8, 9, 3, 64, dtype="float32"),
    # Llama-style GQA with head_dim 128 (8 kv heads: one sublane tile of combined heads).
    KernelShape(16, 8, 32, 8, 128),
    KernelShape(512, 64, 32, 8, 128),
    KernelShape(128, 16, 16, 16, 128),  # MHA
)
