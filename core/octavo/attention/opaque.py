"""Attention as one opaque operator, so ``torch.compile`` (``-O``) sees a model as one graph.

Dynamo cannot trace an attention backend: it plans each step in Python from the host copies
of the metadata (``step_plan``), branches on the batch's make-up and calls C kernels through
ctypes. Each of those would break the graph, and a graph specialised to one step's plan
would be compiled again for the next. vLLM makes its attention a registered custom op
(``unified_attention_with_output``) that Dynamo treats as one opaque call; this module does
the same for Octavo's ``AttentionImpl``:

- ``octavo::attention(query, key, value, kv_cache, layer)`` writes the step's keys and
  values into ``kv_cache`` (declared mutated, so the compiler keeps the write in order) and
  returns the attention output, by calling the layer's real impl - every backend, fused
  kernel and KV-cache dtype works unchanged inside it. Its fake (meta) implementation only
  says the output's shape: the query's, contiguous.
- The step's ``AttentionMetadata`` never enters the graph: the op reads it from the step
  context (``attention_step``), which the compiled forward's caller sets (vLLM's forward
  context). The graph so depends on the number of tokens alone, never on the plan.
- ``make_attention_opaque(model)`` puts an ``OpaqueAttention`` in place of each layer's
  impl (found as ``assign_kv_groups`` finds them, a KV-group wrapper included, so it is
  called after the KV cache is set up) and registers the real one under its index.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from octavo.attention.base import AttentionImpl, AttentionMetadata

# The real impls, indexed by the ``layer`` argument of the op (every compiled model's, for
# the life of the process: a few small objects each); the metadata of the step being run.
# Module state as vLLM's forward context is: the op has no other way in.
_impls: list[AttentionImpl] = []
_step: list[AttentionMetadata] = []


@torch.library.custom_op("octavo::attention", mutates_args=("kv_cache",))
def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              kv_cache: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer``'s attention over the current step (``attention_step``)."""
    if not _step:
        raise RuntimeError("octavo::attention called outside attention_step(metadata)")
    return _impls[layer].forward(query, key, value, kv_cache, _step[-1]).contiguous()


@attention.register_fake
def _attention_shape(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     kv_cache: torch.Tensor, layer: int) -> torch.Tensor:
    del key, value, kv_cache, layer
    return query.new_empty(query.shape)


class OpaqueAttention:
    """Stands in a layer for its impl: ``forward`` is the op with the layer's index (the
    metadata argument stays outside the graph; the op reads the step's)."""

    def __init__(self, impl: AttentionImpl, layer: int) -> None:
        self.impl = impl
        self.layer = layer

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        del metadata
        return torch.ops.octavo.attention(query, key, value, kv_cache, self.layer)


def make_attention_opaque(model: nn.Module) -> int:
    """Replace every attention impl of ``model`` by an ``OpaqueAttention``; how many."""
    found = [(module, name, value) for module in model.modules()
             for name, value in list(vars(module).items())
             if isinstance(value, AttentionImpl)]
    for module, name, impl in found:
        setattr(module, name, OpaqueAttention(impl, len(_impls)))
        _impls.append(impl)
    return len(found)


@contextmanager
def attention_step(metadata: AttentionMetadata) -> Iterator[None]:
    """Run the opaque attention ops inside with ``metadata``."""
    _step.append(metadata)
    try:
        yield
    finally:
        _step.pop()
