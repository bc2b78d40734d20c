"""``KVBlock``: one fixed-size page of the paged KV cache, as the block pool tracks it."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from octavo.block_hash import BlockHash


@dataclass(eq=False)
class KVBlock:
    """Bookkeeping for block ``block_id`` of every layer's KV tensor (the tensors live in the
    workers; the engine only hands out ids).

    ``ref_cnt`` counts the requests holding the block; at 0 it sits in the free queue.
    ``block_hash`` is set while the block is in the prefix cache's hash map, so a block that
    is free *and* hashed can still be reused by a prefix hit until it is evicted.
    ``prev_free``/``next_free`` are the free queue's links, kept on the block itself so a
    prefix hit can take it out of the middle of the queue in O(1).
    ``reserved_by``: the owner a free block is softly reserved for (``BlockPool.reserve``).
    Identity equality (``eq=False``): two blocks are never "equal", only the same block.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)
    reserved_by: Hashable | None = field(default=None, repr=False)
