"""``BlockPool``: every KV block, the free queue, reference counts and the prefix-cache map.

A block is in exactly one of two states: *used* (``ref_cnt > 0``, held by that many
requests) or *free* (``ref_cnt == 0``, in the free queue). Independently, a block may be
*cached*: its chained hash is in ``cached`` and a later request with the same prefix can
take it instead of recomputing. A free cached block keeps its contents until it is handed
out for something else - that is the eviction, and it takes the head of the free queue.

Queue order is the eviction policy: freed cached blocks go to the tail, so the least
recently freed are evicted first (LRU); freed blocks that hold nothing reusable go to the
head, so they are handed out before any cached block is sacrificed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from octavo.block_hash import BlockHash
from octavo.kv.block import KVBlock
from octavo.kv.free_queue import FreeBlockQueue


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(block_id=i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        # One block per hash: when two requests compute the same prefix at the same time,
        # the first to finish a block caches it and the other's copy stays private.
        self.cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now, evicting cached ones if needed."""
        return len(self.free_queue)

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVBlock]:
        """Take ``num_blocks`` from the head of the free queue, evicting their cached
        contents, each with one reference for the caller."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(
                f"cannot allocate {num_blocks} blocks: only {self.num_free_blocks} are free"
            )
        blocks = [self.free_queue.popleft() for _ in range(num_blocks)]
        for block in blocks:
            self._evict(block)
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take one more reference on each of ``blocks`` (prefix hits): a free one leaves the
        free queue, so it can no longer be evicted."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference on each block, in the given order; blocks that reach 0 return
        to the queue - to the tail if cached (evicted last, in that order), else the head.

        Callers pass a request's blocks last-first: a prefix's tail block is worth least
        (it is only reachable through the blocks before it), so it should go first.
        """
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} is freed more often than it is held")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    def cache_full_blocks(
        self, blocks: Sequence[KVBlock], block_hashes: Sequence[BlockHash], start: int, end: int
    ) -> None:
        """Enter ``blocks[start:end]`` (full, their tokens known) into the hash map under
        ``block_hashes[start:end]``. Blocks already cached (prefix hits) stay as they are; a
        block whose hash another block already holds is left uncached."""
        if not self.enable_caching:
            return
        for block, block_hash in zip(blocks[start:end], block_hashes[start:end]):
            if block.block_hash is None and block_hash not in self.cached:
                block.block_hash = block_hash
                self.cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (e.g. after new weights are loaded). Blocks in use keep
        their contents for their requests; they are just no longer shared."""
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None
