"""Default block sizes of the ragged paged attention kernel, per TPU generation.

The numbers come from tpu-inference's auto-tuned table for its RPA v2 kernel
(vllm-project/tpu-inference, tpu_inference/kernels/ragged_paged_attention/v2/tuned_block_sizes.py,
``TUNED_BLOCK_SIZES['TPU v5']`` and ``['TPU v6']``), whose grid, DMA scheme and VMEM budget
ours follows. For page size 16 and bf16 q/kv with grouped heads (e.g. the rows
``('bfloat16', 'bfloat16', 12, 2, 128, 16, 512, 256): (16, 32)`` and
``(..., 32, 8, 128, 16, 512, 256): (16, 32)``, identical on v5e and v6e) the tuned choice is a
KV block covering 256 tokens (16 pages) and 32 queries per block; the same table's fallback for
untuned keys on v5/v6 is ``(128 pages, 32 queries)`` capped at ``pages_per_seq``, and TPU v4
gets ``(32, 32)`` "only to avoid VMEM OOM". We store KV blocks in tokens so that one row serves
every page size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockSizes:
    """Tuning of one generation: KV tokens per KV block and query rows per query block."""

    kv_tokens_per_block: int
    queries_per_block: int


# device_kind prefix -> defaults (see the module docstring for the source rows).
TUNED_BLOCK_SIZES: dict[str, BlockSizes] = {
    "TPU v5": BlockSizes(kv_tokens_per_block=256, queries_per_block=32),  # v5e ("TPU v5 lite"), v5p
    "TPU v6": BlockSizes(kv_tokens_per_block=256, queries_per_block=32),  # v6e ("TPU v6 lite")
    "TPU v4": BlockSizes(kv_tokens_per_block=512, queries_per_block=32),  # (32, 32): VMEM-safe
}
# Off-TPU (interpret mode, lowering for export) and unknown generations.
DEFAULT_BLOCK_SIZES = BlockSizes(kv_tokens_per_block=256, queries_per_block=32)


def device_block_sizes() -> BlockSizes:
    """The tuned defaults of the first JAX device's generation."""
    import jax

    kind = jax.devices()[0].device_kind
    for prefix, sizes in TUNED_BLOCK_SIZES.items():
        if kind.startswith(prefix):
            return sizes
    return DEFAULT_BLOCK_SIZES


def default_block_sizes(page_size: int, pages_per_seq: int, num_tokens: int,
                        query_tile: int) -> tuple[int, int]:
    """``(num_kv_pages_per_block, num_queries_per_block)`` for these shapes: the tuned KV span
    in whole pages (at least one, at most the sequence's page table), and the tuned query
    block, at most the token count rounded up to ``query_tile`` (q's sublane tile)."""
    sizes = device_block_sizes()
    pages = max(1, min(pages_per_seq, sizes.kv_tokens_per_block // page_size))
    queries = min(sizes.queries_per_block, _round_up(num_tokens, query_tile))
    return pages, queries


def _round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple
