"""``KVCacheManager``: which KV blocks each request holds, with prefix caching - the manager
of a model whose layers all attend every earlier token (one full-attention KV group).

The scheduler asks two questions per request and step: how much of this request's prefix
is already cached (``get_computed_blocks``), and can it have slots for N more tokens
(``allocate_slots``, ``None`` when the pool is full - the scheduler then preempts).

When blocks become cached: ``allocate_slots`` enters a block into the prefix cache as soon
as every token in it is scheduled for computation, i.e. *before* the forward pass that
writes its K/V - as vLLM does. A request scheduled later in the same step may then reuse
it, which is correct because the forward pass writes the K/V of all of a step's tokens
into the cache before any attention reads it (the AttentionBackend contract). This is what
lets a burst of requests sharing a prompt prefix compute it once.

It is ``KVCacheCoordinator`` over that one group (as vLLM V1's unitary coordinator), so the
allocation rules are written once; with one group the coordinator reserves no null block
and keys the prefix cache by the plain block hashes.
"""

from __future__ import annotations

from octavo.kv.cache_spec import FullAttentionSpec, KVCacheGroup
from octavo.kv.coordinator import KVCacheCoordinator

# The layers of the one group do not matter to the manager: block ids span all of them.
ALL_LAYERS = KVCacheGroup(FullAttentionSpec(), ())


class KVCacheManager(KVCacheCoordinator):
    """The default manager: one pool of blocks, prefix caching by chained block hashes."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_caching, groups=[ALL_LAYERS])
