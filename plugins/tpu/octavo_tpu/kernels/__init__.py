"""Pallas TPU kernels of the TPU backend: ragged paged attention over the paged KV cache and
the in-place KV write, with a dense jnp reference and the shapes the runner compiles for."""

from .ragged_paged_attention import ragged_paged_attention, ref_ragged_paged_attention, write_kv
from .shapes import KERNEL_SHAPES, KernelShape

__all__ = ["KERNEL_SHAPES", "KernelShape", "ragged_paged_attention",
           "ref_ragged_paged_attention", "write_kv"]
