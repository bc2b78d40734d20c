"""``KVCacheManager``: which KV blocks each request holds, with prefix caching.

The scheduler asks two questions per request and step: how much of this request's prefix
is already cached (``get_computed_blocks``), and can it have slots for N more tokens
(``allocate_slots``, ``None`` when the pool is full - the scheduler then preempts).

When blocks become cached: ``allocate_slots`` enters a block into the prefix cache as soon
as every token in it is scheduled for computation, i.e. *before* the forward pass that
writes its K/V - as vLLM does. A request scheduled later in the same step may then reuse
it, which is correct because the forward pass writes the K/V of all of a step's tokens
into the cache before any attention reads it (the AttentionBackend contract). This is what
lets a burst of requests sharing a prompt prefix compute it once.
"""

from __future__ import annotations

from collections.abc import Sequence

from octavo.block_hash import update_block_hashes
from octavo.kv.block import KVBlock
from octavo.kv.block_pool import BlockPool
from octavo.kv.interface import KVCacheManagerInterface
from octavo.request import Request
from octavo.stats import PrefixCacheStats


class KVCacheManager(KVCacheManagerInterface):
    """The default manager: one pool of blocks, prefix caching by chained block hashes."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.prefix_stats = PrefixCacheStats()
        self._req_blocks: dict[str, list[KVBlock]] = {}
        # How many leading blocks of each request have been offered to the prefix cache.
        self._num_cached_blocks: dict[str, int] = {}

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Share of blocks held by requests (free cached blocks count as free)."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of ``request``: its blocks and their number of tokens.

        Full blocks only, and never the whole sequence: the last token is always recomputed,
        because its logits are what the next token is sampled from. Requests asking for
        prompt logprobs get no hits - those need the logits of every prompt position.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        block_hashes = update_block_hashes(request, self.block_size)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVBlock] = (),
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> list[KVBlock] | None:
        """Make room for ``num_new_tokens`` after the request's computed tokens, plus
        ``num_lookahead_tokens`` of room for speculative drafts.

        ``new_computed_blocks`` are prefix hits from ``get_computed_blocks`` (only on a
        request's first allocation); their tokens count as computed. Returns the blocks
        newly taken from the pool (possibly none), or ``None`` - changing nothing - when
        the pool cannot supply them.

        ``delay_cache_blocks``: the new tokens' KV is being loaded by a KV connector, not
        computed, so their blocks must not be shared before the load is done; they enter
        the prefix cache with the request's next allocation.
        """
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be at least 1, got {num_new_tokens}")
        request_id = request.request_id
        held = self._req_blocks.get(request_id, [])
        if new_computed_blocks and held:
            raise ValueError(f"request {request_id!r} already holds blocks; prefix hits "
                             "can only be given on its first allocation")
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_needed = -(-(num_computed + num_new_tokens + num_lookahead_tokens) // self.block_size)
        num_new_blocks = max(0, num_needed - len(held) - len(new_computed_blocks))
        # Free prefix hits leave the free queue, so they compete with the new blocks.
        num_free_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_new_blocks + num_free_hits > self.pool.num_free_blocks:
            return None

        if request_id not in self._req_blocks and request.num_preemptions == 0:
            self.prefix_stats.record(request.num_tokens, len(new_computed_blocks) * self.block_size)
        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        blocks = self._req_blocks.setdefault(request_id, [])
        blocks.extend(new_computed_blocks)
        blocks.extend(new_blocks)
        self._cache_full_blocks(
            request, blocks, num_computed + (0 if delay_cache_blocks else num_new_tokens))
        return new_blocks

    def free(self, request: Request) -> None:
        """Release the request's blocks (finished, aborted or preempted). Cached blocks stay
        findable until evicted; a request holding nothing is a no-op."""
        blocks = self._req_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def free_trailing_blocks(self, request: Request, num_tokens: int) -> int | None:
        """Release the request's blocks past the first ``num_tokens`` tokens - the slots of
        rejected speculative drafts (and unused lookahead). Returns how many blocks it
        keeps, or ``None`` when nothing was released. Those blocks never entered the prefix
        cache: only blocks full of known tokens do, and these hold none."""
        blocks = self._req_blocks.get(request.request_id)
        keep = -(-num_tokens // self.block_size)
        if blocks is None or len(blocks) <= keep:
            return None
        surplus = blocks[keep:]
        del blocks[keep:]
        self.pool.free_blocks(reversed(surplus))
        return keep

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (empty for a request holding no blocks)."""
        return [block.block_id for block in self._req_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()

    def _cache_full_blocks(self, request: Request, blocks: list[KVBlock], num_tokens: int) -> None:
        """Offer the request's blocks that ``num_tokens`` fill completely to the prefix cache."""
        if not self.enable_caching:
            return
        start = self._num_cached_blocks.get(request.request_id, 0)
        block_hashes = update_block_hashes(request, self.block_size)
        end = min(num_tokens // self.block_size, len(block_hashes))
        if end > start:
            self.pool.cache_full_blocks(blocks, block_hashes, start, end)
            self._num_cached_blocks[request.request_id] = end
