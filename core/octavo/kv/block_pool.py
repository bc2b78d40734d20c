"""``BlockPool``: every KV block, the free queue, reference counts and the prefix-cache map.

A block is in exactly one of two states: *used* (``ref_cnt > 0``, held by that many
requests) or *free* (``ref_cnt == 0``, in the free queue). Independently, a block may be
*cached*: its chained hash is in ``cached`` and a later request with the same prefix can
take it instead of recomputing. A free cached block keeps its contents until it is handed
out for something else - that is the eviction, and it takes the head of the free queue.

Queue order is the eviction policy: freed cached blocks go to the tail, so the least
recently freed are evicted first (LRU); freed blocks that hold nothing reusable go to the
head, so they are handed out before any cached block is sacrificed.

Adjacent blocks (why a request's next block is, where it can be, the one after its last):
requests that prefill together and then decode in lockstep all cross a block boundary at
the same step; taking the queue's head one each, a request's decode blocks would land a
batch apart, and the CPU decode attention, which streams a request's blocks in order,
prefetches best over adjacent ones. So ``get_new_blocks`` given the request's last block
takes the block right after it when that block is free, holds no cached prefix and is not
reserved for someone else; and ``reserve`` *softly* reserves the run after a request's
blocks for its growth. A reserved block stays free (counted, and handed to anyone once the
plain free blocks run out): it only moves in the free queue from the plain uncached blocks
to behind them (in front of the queue's marker), ahead of every cached block. So the
eviction order of cached blocks is untouched, no prefix is evicted while an uncached
block is free, and a reservation never makes an allocation fail. Only uncached blocks are
ever moved out of order; every step is O(1) per block (a reservation's list is at most
``MAX_RESERVED`` long).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from octavo.block_hash import BlockHash
from octavo.kv.block import KVBlock
from octavo.kv.free_queue import FreeBlockQueue

# The longest soft reservation a request gets: 16 blocks cover 256 tokens of decode
# growth at the default block size, W1's 128 output tokens with room to spare.
MAX_RESERVED = 16


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
        # Soft reservations: owner -> the free blocks reserved after its last block, in
        # block order (each block's ``reserved_by`` names the owner).
        self._reserved: dict[Hashable, list[KVBlock]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now, evicting cached ones if needed."""
        return len(self.free_queue)

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int, after: KVBlock | None = None,
                       owner: Hashable | None = None) -> list[KVBlock]:
        """Take ``num_blocks`` free blocks, evicting their cached contents, each with one
        reference for the caller.

        ``after``: the caller's last block; each new block is then the one right after the
        previous where that one is free, uncached and not reserved for another owner than
        ``owner``, else the free queue's head (``owner``'s reservation, no longer adjacent,
        is then given back first, so the head is its run)."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(
                f"cannot allocate {num_blocks} blocks: only {self.num_free_blocks} are free"
            )
        blocks = []
        for _ in range(num_blocks):
            block = None if after is None else self._adjacent_free(after, owner)
            if block is None:
                if owner is not None:
                    self.release_reservation(owner)
                block = self.free_queue.popleft()
            else:
                self.free_queue.remove(block)
            self._unreserve(block)
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
            after = block
        return blocks

    def reserve(self, owner: Hashable, last: KVBlock, num_blocks: int) -> None:
        """Softly reserve for ``owner`` up to ``num_blocks`` (at most ``MAX_RESERVED``)
        blocks in a run right after ``last``, its last block (see the module docstring);
        the run stops at the first block that is not free, uncached and unreserved."""
        run = self._reserved.setdefault(owner, [])
        end = run[-1] if run else last
        while len(run) < min(num_blocks, MAX_RESERVED):
            block = self._adjacent_free(end, None)
            if block is None:
                break
            self.free_queue.remove(block)
            self.free_queue.append_before_marker(block)
            block.reserved_by = owner
            run.append(block)
            end = block
        if not run:
            del self._reserved[owner]

    def release_reservation(self, owner: Hashable) -> None:
        """Give ``owner``'s reserved blocks back to the head of the free queue, in block
        order: the next allocation from the head takes them as a run."""
        for block in reversed(self._reserved.pop(owner, ())):
            block.reserved_by = None
            self.free_queue.remove(block)
            self.free_queue.appendleft(block)

    def _adjacent_free(self, block: KVBlock, owner: Hashable | None) -> KVBlock | None:
        """The block after ``block`` if it is free, uncached and unreserved or reserved for
        ``owner``; else None."""
        nxt_id = block.block_id + 1
        if nxt_id >= self.num_blocks:
            return None
        nxt = self.blocks[nxt_id]
        if nxt.ref_cnt or nxt.block_hash is not None:
            return None
        if nxt.reserved_by is not None and (owner is None or nxt.reserved_by != owner):
            return None
        return nxt

    def _unreserve(self, block: KVBlock) -> None:
        """``block`` leaves its reservation (taken by its owner or by anyone)."""
        if block.reserved_by is None:
            return
        run = self._reserved[block.reserved_by]
        run.remove(block)
        if not run:
            del self._reserved[block.reserved_by]
        block.reserved_by = None

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
