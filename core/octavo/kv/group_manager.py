"""One KV group's block tables in a pool shared by every group (vLLM's single-type managers).

``KVCacheCoordinator`` asks each group the same questions in phases, so that one group
taking blocks from the shared free queue cannot evict a cached block another group is about
to reuse: how many blocks a request's allocation needs here, then (when every group can
have them) take the prefix hits, then release what fell out of the window, then take the
new blocks.

A group's block table stays indexed by ``position // block_size``: a sliding-window group
puts the pool's null block (a reserved block id, never handed out, never written) where
blocks its window no longer covers were, and where a prefix hit needs no block.

Prefix-cache keys carry the group (``block hash + group id``): the same tokens have one
cached block per group, each holding only its group's layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from octavo.block_hash import BlockHash
from octavo.kv.block import KVBlock
from octavo.kv.block_pool import BlockPool
from octavo.kv.cache_spec import SlidingWindowSpec
from octavo.request import Request


class GroupManager:
    """A full-attention group: every block of the request stays until it is freed."""

    def __init__(self, pool: BlockPool, null_block: KVBlock | None, block_size: int,
                 group_id: int | None) -> None:
        """``null_block``: None where no group needs one; ``group_id``: None for the only
        group, whose keys are the plain block hashes."""
        self.pool = pool
        self.null_block = null_block
        self.block_size = block_size
        self.key_suffix = b"" if group_id is None else group_id.to_bytes(2, "big")
        self.req_blocks: dict[str, list[KVBlock]] = {}
        # How many leading blocks of each request have been offered to the prefix cache.
        self._num_cached_blocks: dict[str, int] = {}

    def key(self, block_hash: BlockHash) -> BlockHash:
        return block_hash + self.key_suffix

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash],
                               max_blocks: int) -> list[KVBlock]:
        """The cached blocks of the longest prefix of at most ``max_blocks`` blocks."""
        hits: list[KVBlock] = []
        for block_hash in block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(self.key(block_hash))
            if block is None:
                break
            hits.append(block)
        return hits

    def num_blocks_to_allocate(self, request_id: str, num_blocks: int,
                               hits: Sequence[KVBlock]) -> int:
        """Blocks this allocation takes from the free queue: new ones, and prefix hits now
        free (they leave the queue)."""
        held = len(self.req_blocks.get(request_id, ())) + len(hits)
        free_hits = sum(1 for block in hits if block.ref_cnt == 0)
        return max(0, num_blocks - held) + free_hits

    def num_reclaimable(self, request_id: str, num_computed: int) -> int:
        """Blocks that releasing the skipped ones would return to the free queue."""
        del request_id, num_computed
        return 0

    def save_hits(self, request_id: str, hits: Sequence[KVBlock]) -> None:
        self.pool.touch(block for block in hits if block is not self.null_block)
        self.req_blocks.setdefault(request_id, []).extend(hits)

    def remove_skipped_blocks(self, request_id: str, num_computed: int) -> None:
        """Release the blocks no later token attends (none under full attention)."""
        del request_id, num_computed

    def allocate_new(self, request_id: str, num_blocks: int, reserve: int = 0) -> list[KVBlock]:
        """Grow the request's table to ``num_blocks`` blocks; the new ones. Each new block
        is the one after the request's last where the pool allows, and ``reserve`` more
        after them are softly reserved for its growth (``BlockPool``: adjacent blocks)."""
        blocks = self.req_blocks.setdefault(request_id, [])
        owner = (request_id, self.key_suffix)
        new = self.pool.get_new_blocks(max(0, num_blocks - len(blocks)),
                                       self._last_live(blocks), owner)
        blocks.extend(new)
        last = self._last_live(blocks)
        if reserve > 0 and last is not None:
            self.pool.reserve(owner, last, reserve)
        return new

    def _last_live(self, blocks: Sequence[KVBlock]) -> KVBlock | None:
        """The request's last block, unless it has none or it is the null block."""
        if not blocks or blocks[-1] is self.null_block:
            return None
        return blocks[-1]

    def cache_full_blocks(self, request: Request, block_hashes: Sequence[BlockHash],
                          num_tokens: int) -> None:
        """Offer the request's blocks that ``num_tokens`` fill completely to the cache."""
        request_id = request.request_id
        blocks = self.req_blocks[request_id]
        start = self._num_cached_blocks.get(request_id, 0)
        end = min(num_tokens // self.block_size, len(block_hashes), len(blocks))
        if end <= start:
            return
        live = [i for i in range(start, end) if blocks[i] is not self.null_block]
        self.pool.cache_full_blocks([blocks[i] for i in live],
                                    [self.key(block_hashes[i]) for i in live], 0, len(live))
        self._num_cached_blocks[request_id] = end

    def free(self, request_id: str) -> None:
        """Release every block, last first (a prefix's tail is worth least)."""
        blocks = self.req_blocks.pop(request_id, [])
        self._num_cached_blocks.pop(request_id, None)
        # The reservation first: the blocks freed after it go in front, so the free
        # queue's head is the request's blocks and then its reservation, one run.
        self.pool.release_reservation((request_id, self.key_suffix))
        self.pool.free_blocks(block for block in reversed(blocks)
                              if block is not self.null_block)

    def free_trailing(self, request_id: str, keep: int) -> bool:
        """Release the blocks past the first ``keep``; whether there were any."""
        blocks = self.req_blocks.get(request_id)
        if blocks is None or len(blocks) <= keep:
            return False
        surplus = blocks[keep:]
        del blocks[keep:]
        self.pool.free_blocks(block for block in reversed(surplus)
                              if block is not self.null_block)
        return True

    def block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_blocks.get(request_id, ())]


class SlidingWindowGroupManager(GroupManager):
    """A sliding-window group: a token at position ``p`` attends positions
    ``p - window + 1 .. p``, so once the request's next token is at ``p``, every block
    ending before ``p - window + 1`` is released (cached ones stay findable until evicted)
    and the null block takes its place."""

    null_block: KVBlock

    def __init__(self, pool: BlockPool, null_block: KVBlock, block_size: int,
                 group_id: int | None, spec: SlidingWindowSpec) -> None:
        super().__init__(pool, null_block, block_size, group_id)
        self.sliding_window = spec.sliding_window

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash],
                               max_blocks: int) -> list[KVBlock]:
        """vLLM's rule: the longest prefix of at most ``max_blocks`` blocks whose last
        ``ceil((window - 1) / block_size)`` blocks - all the next token's window needs of
        it - are cached; the blocks before them are the null block. A run that reaches the
        first block is a hit even when shorter."""
        needed = -(-(self.sliding_window - 1) // self.block_size)
        if needed == 0:
            return [self.null_block] * max_blocks
        hits = [self.null_block] * max_blocks
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            block = self.pool.get_cached_block(self.key(block_hashes[i]))
            if block is None:
                run = 0
                continue
            hits[i] = block
            run += 1
            if run == needed:
                return hits[:i + run]
        return hits[:run]

    def _first_needed_block(self, num_computed: int) -> int:
        """The first block the window of the token at ``num_computed`` reaches into."""
        return max(0, num_computed - self.sliding_window + 1) // self.block_size

    def _window_start(self, request_id: str, num_computed: int) -> int:
        """The request's first block the next token's window needs (capped by its table)."""
        return min(self._first_needed_block(num_computed),
                   len(self.req_blocks.get(request_id, ())))

    def _skipped(self, request_id: str, num_computed: int) -> list[KVBlock]:
        """The live blocks before the window, last first. Blocks before a null one are
        null already (nulls only ever grow from the front)."""
        blocks = self.req_blocks.get(request_id, [])
        skipped: list[KVBlock] = []
        for i in range(self._window_start(request_id, num_computed) - 1, -1, -1):
            if blocks[i] is self.null_block:
                break
            skipped.append(blocks[i])
        return skipped

    def num_reclaimable(self, request_id: str, num_computed: int) -> int:
        return sum(1 for block in self._skipped(request_id, num_computed)
                   if block.ref_cnt == 1)

    def remove_skipped_blocks(self, request_id: str, num_computed: int) -> None:
        skipped = self._skipped(request_id, num_computed)
        if not skipped:
            return
        blocks = self.req_blocks[request_id]
        end = self._window_start(request_id, num_computed)
        blocks[end - len(skipped):end] = [self.null_block] * len(skipped)
        self.pool.free_blocks(skipped)
