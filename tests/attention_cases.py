"""Attention test cases for the kernel tests (tests/triton), from the conformance kit's case
builder (``octavo.testing.attention_cases``): one step of requests in a random,
non-contiguous paged cache whose unused blocks hold noise, and the dense fp64 reference."""

from __future__ import annotations

import torch

from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.testing.attention import MIXED_BATCH
from octavo.testing.attention_cases import Shape, Step, build_step
from octavo.testing.attention_cases import dense_reference as step_reference

__all__ = ["DECODE_BATCH", "MIXED_BATCH", "NUM_KV_HEADS", "Case", "dense_reference",
           "make_case", "run_backend"]

NUM_KV_HEADS = 2
DECODE_BATCH = [(0, 1), (15, 1), (16, 1), (63, 1), (100, 1)]  # single-token decodes
Case = Step



def make_case(requests: list[tuple[int, int]], num_heads: int, head_dim: int,
              block_size: int, dtype: torch.dtype, seed: int) -> Step:
    return build_step(requests, Shape(num_heads, NUM_KV_HEADS, head_dim, block_size), dtype,
                      seed, shuffled=True)


def dense_reference(case: Step, requests: list[tuple[int, int]], scale: float,
                    sliding_window: int | None) -> torch.Tensor:
    """softmax(QK^T)V per request in fp64 from the full K/V (``requests`` are the case's)."""
    assert requests == case.requests
    return step_reference(case, scale, sliding_window)


def run_backend(case: Step, num_heads: int, head_dim: int, sliding_window: int | None = None,
                backend: type[TorchAttentionBackend] = TorchAttentionBackend) -> torch.Tensor:
    """One ``forward`` of ``backend``'s impl over the case (which writes its K/V)."""
    impl = backend.make_impl(num_heads, head_dim, head_dim**-0.5, NUM_KV_HEADS, sliding_window)
    return impl.forward(case.query, case.key, case.value, case.kv_cache, case.metadata)
