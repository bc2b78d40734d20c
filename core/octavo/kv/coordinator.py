"""``KVCacheCoordinator``: the KV-cache manager of a model with several KV groups (vLLM's
hybrid coordinator), e.g. sliding-window layers mixed with full-attention ones.

It answers the scheduler like ``KVCacheManager`` (``KVCacheManagerInterface``) for every
group at once, over one pool of blocks (see ``octavo.kv.cache_spec`` for the layout):

- a prefix hit is the longest prefix every group has cached (a sliding-window group only
  needs the blocks its window still covers), so each group gets as many hit blocks;
  ``get_computed_blocks`` returns them concatenated group after group;
- ``allocate_slots`` succeeds only when every group can have its blocks, and otherwise
  returns ``None`` changing nothing; its new blocks also come group after group, equally
  many per group (every group's table covers the same positions), which
  ``group_new_block_ids`` splits;
- the block tables of all groups have one length, so trimming them after speculative
  drafts (``free_trailing_blocks``) keeps the same count in each.

A model with SSM layers (Mamba) also holds a state slot per running request
(``StateSlotPool``): taken with the request's first allocation, which fails (changing
nothing) without a free one, and given back when the request is freed.

With a sliding-window group, block 0 is the pool's null block: taken from the pool once,
never freed, never written. ``KVCacheManager`` is the coordinator of one full-attention
group, which needs no null block.
"""

from __future__ import annotations

from collections.abc import Sequence

from octavo.block_hash import update_block_hashes
from octavo.kv.block import KVBlock
from octavo.kv.block_pool import MAX_RESERVED, BlockPool
from octavo.kv.cache_spec import KVCacheGroup, SlidingWindowSpec
from octavo.kv.group_manager import GroupManager, SlidingWindowGroupManager
from octavo.kv.interface import KVCacheManagerInterface
from octavo.kv.state_pool import StateSlotPool
from octavo.request import Request
from octavo.stats import PrefixCacheStats


class KVCacheCoordinator(KVCacheManagerInterface):
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, *,
                 groups: Sequence[KVCacheGroup], num_state_slots: int = 0) -> None:
        """``num_state_slots``: the pool of per-request states of a model with SSM layers
        (``StateSlotPool``; 0: none)."""
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if not groups:
            raise ValueError("the coordinator needs at least one KV group")
        sliding = any(isinstance(group.spec, SlidingWindowSpec) for group in groups)
        if sliding and num_blocks < 2:
            raise ValueError(f"a KV cache with a sliding-window group needs at least 2 "
                             f"blocks (one is the null block), got {num_blocks}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.null_block = self.pool.get_new_blocks(1)[0] if sliding else None
        self.kv_groups = tuple(groups)
        self.num_kv_groups = len(groups)
        self.managers = [self._manager(group_id, group)
                         for group_id, group in enumerate(groups)]
        self.state_slots = StateSlotPool(num_state_slots) if num_state_slots else None
        self.prefix_stats = PrefixCacheStats()

    def _manager(self, group_id: int, group: KVCacheGroup) -> GroupManager:
        # One group needs no group id in its prefix-cache keys: they are the block hashes.
        key_id = group_id if len(self.kv_groups) > 1 else None
        if isinstance(group.spec, SlidingWindowSpec):
            assert self.null_block is not None
            return SlidingWindowGroupManager(self.pool, self.null_block, self.block_size,
                                             key_id, group.spec)
        return GroupManager(self.pool, self.null_block, self.block_size, key_id)

    @property
    def num_blocks(self) -> int:
        """Blocks that can be handed out (the null block is not)."""
        return self.pool.num_blocks - (self.null_block is not None)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Share of blocks held by requests (free cached blocks count as free)."""
        return 1.0 - self.pool.num_free_blocks / self.num_blocks

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest prefix every group has cached: each group's hit blocks (as many per
        group), concatenated in group order, and their number of tokens.

        Full blocks only: the last token is always recomputed, because its logits are what
        the next token is sampled from; requests asking for prompt logprobs need the logits
        of every prompt position."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        block_hashes = update_block_hashes(request, self.block_size)
        length = min((request.num_tokens - 1) // self.block_size, len(block_hashes))
        while True:  # each group may shorten the hit; stop when none does
            hits = [manager.find_longest_cache_hit(block_hashes, length)
                    for manager in self.managers]
            shortest = min(len(group_hits) for group_hits in hits)
            if shortest == length:
                break
            length = shortest
        return [block for group_hits in hits for block in group_hits], length * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVBlock] = (),
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> list[KVBlock] | None:
        """Make room for ``num_new_tokens`` after the request's computed tokens, plus
        ``num_lookahead_tokens`` of room for speculative drafts, in every group.

        ``new_computed_blocks`` are prefix hits from ``get_computed_blocks`` (only on a
        request's first allocation); their tokens count as computed. Returns the blocks
        newly taken from the pool (possibly none), group after group, or ``None`` -
        changing nothing - unless every group can have its blocks. Sliding-window groups
        first release the blocks that fell out of the window of the request's next token;
        those count as free for the check.

        ``delay_cache_blocks``: the new tokens' KV is being loaded by a KV connector, not
        computed, so their blocks must not be shared before the load is done; they enter
        the prefix cache with the request's next allocation.
        """
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be at least 1, got {num_new_tokens}")
        request_id = request.request_id
        hits = self._split(new_computed_blocks)
        if new_computed_blocks and self.managers[0].req_blocks.get(request_id):
            raise ValueError(f"request {request_id!r} already holds blocks; prefix hits "
                             "can only be given on its first allocation")
        num_computed = request.num_computed_tokens + len(hits[0]) * self.block_size
        num_blocks = -(-(num_computed + num_new_tokens + num_lookahead_tokens)
                       // self.block_size)
        needed = sum(manager.num_blocks_to_allocate(request_id, num_blocks, group_hits)
                     for manager, group_hits in zip(self.managers, hits))
        reclaimable = sum(manager.num_reclaimable(request_id, num_computed)
                          for manager in self.managers)
        if needed > self.pool.num_free_blocks + reclaimable:
            return None
        states = self.state_slots
        if states is not None and states.slot_of(request_id) is None and not states.num_free:
            return None

        if request_id not in self.managers[0].req_blocks and request.num_preemptions == 0:
            self.prefix_stats.record(request.num_tokens, num_computed - request.num_computed_tokens)
        # Every group takes its hits before any takes new blocks, which could evict them.
        for manager, group_hits in zip(self.managers, hits):
            manager.save_hits(request_id, group_hits)
        if states is not None:
            states.take(request_id)
        for manager in self.managers:
            manager.remove_skipped_blocks(request_id, num_computed)
        reserve = self._blocks_to_reserve(request, num_blocks)
        new_blocks = [block for manager in self.managers
                      for block in manager.allocate_new(request_id, num_blocks, reserve)]
        if self.enable_caching:
            block_hashes = update_block_hashes(request, self.block_size)
            num_known = num_computed + (0 if delay_cache_blocks else num_new_tokens)
            for manager in self.managers:
                manager.cache_full_blocks(request, block_hashes, num_known)
        return new_blocks

    def _blocks_to_reserve(self, request: Request, num_blocks: int) -> int:
        """How many blocks past its ``num_blocks`` the request's table may still grow: to
        where it stops at ``max_tokens`` (with none, the longest soft reservation)."""
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is None:
            return MAX_RESERVED
        return -(-(request.num_prompt_tokens + max_tokens) // self.block_size) - num_blocks

    def _split(self, blocks: Sequence[KVBlock]) -> list[Sequence[KVBlock]]:
        """Per-group slices of blocks laid out group after group, equally many each."""
        per_group, rest = divmod(len(blocks), self.num_kv_groups)
        if rest:
            raise ValueError(f"{len(blocks)} blocks cannot be split evenly into "
                             f"{self.num_kv_groups} KV groups")
        return [blocks[g * per_group:(g + 1) * per_group] for g in range(self.num_kv_groups)]

    def group_new_block_ids(self, new_blocks: Sequence[KVBlock]) -> list[list[int]]:
        """``allocate_slots``' new blocks as block ids per group."""
        return [[block.block_id for block in group] for group in self._split(new_blocks)]

    def free(self, request: Request) -> None:
        for manager in self.managers:
            manager.free(request.request_id)
        if self.state_slots is not None:
            self.state_slots.release(request.request_id)

    def get_state_slot(self, request_id: str) -> int:
        slot = None if self.state_slots is None else self.state_slots.slot_of(request_id)
        return -1 if slot is None else slot

    def free_trailing_blocks(self, request: Request, num_tokens: int) -> int | None:
        keep = -(-num_tokens // self.block_size)
        released = [manager.free_trailing(request.request_id, keep)
                    for manager in self.managers]
        return keep if any(released) else None

    def get_block_ids(self, request_id: str) -> list[int]:
        """Group 0's block table (``get_group_block_ids`` has every group's)."""
        return self.managers[0].block_ids(request_id)

    def get_group_block_ids(self, request_id: str) -> list[list[int]]:
        return [manager.block_ids(request_id) for manager in self.managers]

    def num_held_blocks(self, request_id: str) -> list[int]:
        """Blocks (not the null block) each group holds for the request."""
        return [sum(1 for block in manager.req_blocks.get(request_id, ())
                    if block is not self.null_block) for manager in self.managers]

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
