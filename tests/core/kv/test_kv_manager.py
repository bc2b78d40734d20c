"""KVCacheManager: seeded random operation sequences checked against invariants, plus the
behaviours one by one (prefix hits, LRU eviction, no room, caching off, stats)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from octavo.kv.block import KVBlock
from octavo.kv.manager import KVCacheManager
from octavo.request import Request
from octavo.testing.seeds import draw_seed
from tests.core.scheduler_fakes import make_request

BS = 4
NUM_BLOCKS = 24


@dataclass
class _World:
    """The manager under test plus what the test knows independently of it."""

    manager: KVCacheManager
    live: dict[str, Request] = field(default_factory=dict)
    # block id -> per-slot content written by the "forward pass": the whole token prefix.
    content: dict[int, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    freed_at: dict[int, int] = field(default_factory=dict)  # block id -> when it went free
    clock: int = 0

    def blocks_of(self, request: Request) -> list[KVBlock]:
        pool = self.manager.pool
        return [pool.blocks[i] for i in self.manager.get_block_ids(request.request_id)]

    def compute(self, request: Request, num_hit: int, num_new: int) -> None:
        """What the forward pass does with the slots: write K/V of the new tokens."""
        tokens = request.all_token_ids
        blocks = self.blocks_of(request)
        start = request.num_computed_tokens + num_hit
        for pos in range(start, start + num_new):
            block = blocks[pos // BS]
            assert block.ref_cnt == 1, f"writing into block {block.block_id}, shared"
            self.content.setdefault(block.block_id, {})[pos % BS] = tuple(tokens[:pos + 1])
        request.num_computed_tokens = start + num_new

    def free(self, request: Request) -> None:
        for block in reversed(self.blocks_of(request)):
            self.clock += 1
            if block.ref_cnt == 1:
                self.freed_at[block.block_id] = self.clock
        self.manager.free(request)
        del self.live[request.request_id]

    def allocate(self, request: Request, num_new: int, hits: list[KVBlock] = ()) -> bool:
        """allocate_slots, checking eviction order and that a refusal changes nothing."""
        pool = self.manager.pool
        before_cached = dict(pool.cached)
        before_free = [b.block_id for b in pool.free_queue]
        new_blocks = self.manager.allocate_slots(request, num_new, hits)
        if new_blocks is None:
            assert [b.block_id for b in pool.free_queue] == before_free
            assert pool.cached == before_cached
            return False
        evicted = [b for h, b in before_cached.items() if h not in pool.cached]
        still_free_cached = [b for b in pool.free_queue if b.block_hash is not None]
        for block in evicted:
            assert all(self.freed_at[block.block_id] < self.freed_at[other.block_id]
                       for other in still_free_cached), "eviction is not least recently freed"
        if evicted:
            assert all(b.block_hash is not None for b in pool.free_queue), (
                "a cached block was evicted while an uncached free block was left")
        return True

    def check_hits(self, request: Request, hits: list[KVBlock], num_hit: int) -> None:
        tokens = request.all_token_ids
        assert num_hit == len(hits) * BS and num_hit < request.num_tokens
        for i, block in enumerate(hits):
            for offset in range(BS):
                pos = i * BS + offset
                written = self.content.get(block.block_id, {}).get(offset)
                assert written == tuple(tokens[:pos + 1]), (
                    f"prefix hit on block {block.block_id} holds other tokens")

    def check_invariants(self) -> None:
        pool = self.manager.pool
        holders: Counter[int] = Counter()
        positions: dict[int, set[int]] = {}
        for request in self.live.values():
            ids = self.manager.get_block_ids(request.request_id)
            assert len(set(ids)) == len(ids), "a request holds a block twice"
            assert len(ids) * BS >= request.num_computed_tokens
            holders.update(ids)
            for index, block_id in enumerate(ids):
                positions.setdefault(block_id, set()).add(index)
        free = list(pool.free_queue)
        free_ids = {b.block_id for b in free}
        assert len(free_ids) == len(free) == len(pool.free_queue)
        for block in pool.blocks:
            assert block.ref_cnt == holders[block.block_id], f"ref count of {block}"
            assert (block.block_id in free_ids) == (block.ref_cnt == 0)
            if block.ref_cnt > 1:  # shared: only as a cached prefix block, at one position
                assert block.block_hash is not None and len(positions[block.block_id]) == 1
            if block.block_hash is not None:
                assert pool.cached[block.block_hash] is block
        assert all(block.block_hash == h for h, block in pool.cached.items())
        used = sum(1 for b in pool.blocks if b.ref_cnt > 0)
        assert len(free) + used == NUM_BLOCKS
        assert self.manager.usage == pytest.approx(used / NUM_BLOCKS)


def _random_prompt(rng: random.Random, prefixes: list[list[int]]) -> list[int]:
    if rng.random() < 0.2:  # a whole shared prefix, block-aligned: all of it is cached
        return rng.choice(prefixes)[:rng.randrange(1, 5) * BS]
    prefix = rng.choice(prefixes)[:rng.randrange(0, 4 * BS)]
    return prefix + [rng.randrange(1000) for _ in range(rng.randrange(1, 3 * BS))]


def _step(world: _World, rng: random.Random, prefixes: list[list[int]], serial: int) -> None:
    op = rng.choices(["add", "grow", "free"], weights=[3, 6, 2])[0]
    if op == "add" or not world.live:
        request = make_request(f"r{serial}", _random_prompt(rng, prefixes),
                               cache_salt=rng.choice([None, None, "s"]))
        hits, num_hit = world.manager.get_computed_blocks(request)
        world.check_hits(request, hits, num_hit)
        num_new = rng.randrange(1, request.num_tokens - num_hit + 1)
        if world.allocate(request, num_new, hits):
            world.live[request.request_id] = request
            world.compute(request, num_hit, num_new)
        return
    request = world.live[rng.choice(sorted(world.live))]
    if op == "free":
        world.free(request)
        return
    if request.num_computed_tokens == request.num_tokens:  # decode: a new token arrived
        request.output_token_ids.append(rng.randrange(1000))
    num_new = rng.randrange(1, request.num_tokens - request.num_computed_tokens + 1)
    if world.allocate(request, num_new):
        world.compute(request, 0, num_new)
    else:  # what the scheduler does when there is no room: preempt
        world.free(request)


@pytest.mark.parametrize("enable_caching", [True, False])
def test_random_operation_sequences_keep_invariants(enable_caching: bool) -> None:
    seed = draw_seed()
    print(f"seed={seed}")
    rng = random.Random(seed)
    for _ in range(4):
        world = _World(KVCacheManager(NUM_BLOCKS, BS, enable_caching=enable_caching))
        prefixes = [[rng.randrange(1000) for _ in range(4 * BS)] for _ in range(3)]
        for serial in range(500):
            _step(world, rng, prefixes, serial)
            world.check_invariants()
        stats = world.manager.prefix_stats
        assert (stats.hits > 0) == enable_caching, f"seed={seed}: {stats}"
        for request in list(world.live.values()):
            world.free(request)
        world.check_invariants()
        assert world.manager.num_free_blocks == NUM_BLOCKS


def _prefilled(manager: KVCacheManager, request_id: str, tokens: list[int]) -> Request:
    request = make_request(request_id, tokens)
    hits, num_hit = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - num_hit, hits) is not None
    request.num_computed_tokens = request.num_tokens
    return request


def _tokens(n: int) -> list[int]:
    return [random.randrange(100, 50_000) for _ in range(n)]


def test_prefix_hit_shares_blocks_but_never_the_whole_prompt() -> None:
    manager = KVCacheManager(16, BS)
    tokens = _tokens(3 * BS)
    first = _prefilled(manager, "a", tokens)
    hits, num_hit = manager.get_computed_blocks(make_request("b", tokens))
    assert num_hit == 2 * BS  # the last block is recomputed: its last token needs logits
    assert [b.block_id for b in hits] == manager.get_block_ids("a")[:2]
    longer = make_request("c", tokens + _tokens(1))
    hits, num_hit = manager.get_computed_blocks(longer)
    assert num_hit == 3 * BS
    manager.allocate_slots(longer, 1, hits)
    assert [b.ref_cnt for b in hits] == [2, 2, 2]
    manager.free(first)
    assert [b.ref_cnt for b in hits] == [1, 1, 1]


def test_cached_blocks_survive_free_and_are_evicted_least_recently_freed_first() -> None:
    manager = KVCacheManager(9, BS)
    prompts = {name: _tokens(3 * BS) for name in "abc"}
    requests = {name: _prefilled(manager, name, prompts[name]) for name in "abc"}
    for name in "abc":  # a is freed first: the least recently used
        manager.free(requests[name])
    assert manager.num_free_blocks == 9
    intruder = make_request("x", _tokens(2 * BS))
    assert manager.allocate_slots(intruder, intruder.num_tokens) is not None
    hit_tokens = {name: manager.get_computed_blocks(make_request("q", prompts[name] + [7]))[1]
                  for name in "abc"}
    # a's blocks went tail-first: its first block survives, the two after it are gone.
    assert hit_tokens == {"a": BS, "b": 3 * BS, "c": 3 * BS}


def test_uncached_blocks_are_reused_before_any_cached_block() -> None:
    manager = KVCacheManager(3, BS)
    tokens = _tokens(2 * BS + 1)  # 2 full blocks (cached) + 1 partial (not cacheable)
    manager.free(_prefilled(manager, "a", tokens))
    request = make_request("b", _tokens(BS - 1))
    assert manager.allocate_slots(request, BS - 1) is not None
    assert manager.get_computed_blocks(make_request("q", tokens))[1] == 2 * BS


def test_no_room_returns_none_and_changes_nothing() -> None:
    manager = KVCacheManager(5, BS)
    held = _prefilled(manager, "a", _tokens(3 * BS))
    request = make_request("b", _tokens(3 * BS))
    assert manager.allocate_slots(request, 3 * BS) is None
    assert manager.get_block_ids("b") == [] and manager.num_free_blocks == 2
    assert manager.allocate_slots(request, BS) is not None
    held.output_token_ids.append(5)
    # 13 tokens + 4 lookahead slots = 5 blocks: 2 more than held, 1 free.
    assert manager.allocate_slots(held, 1, num_lookahead_tokens=BS) is None
    assert len(manager.get_block_ids("a")) == 3
    manager.free(request)
    assert len(manager.allocate_slots(held, 1, num_lookahead_tokens=BS)) == 2
    assert manager.num_free_blocks == 0 and manager.usage == 1.0


def test_caching_off_never_hits_and_never_caches() -> None:
    manager = KVCacheManager(8, BS, enable_caching=False)
    tokens = _tokens(3 * BS)
    manager.free(_prefilled(manager, "a", tokens))
    assert manager.get_computed_blocks(make_request("b", tokens)) == ([], 0)
    assert manager.pool.cached == {}
    assert all(block.block_hash is None for block in manager.pool.blocks)


def test_salt_and_prompt_logprobs_keep_requests_off_the_cache() -> None:
    manager = KVCacheManager(8, BS)
    tokens = _tokens(3 * BS)
    _prefilled(manager, "a", tokens)
    assert manager.get_computed_blocks(make_request("b", tokens, cache_salt="x"))[1] == 0
    assert manager.get_computed_blocks(make_request("c", tokens, prompt_logprobs=1))[1] == 0
    assert manager.get_computed_blocks(make_request("d", tokens))[1] == 2 * BS


def test_reset_prefix_cache_forgets_every_prefix() -> None:
    manager = KVCacheManager(8, BS)
    tokens = _tokens(3 * BS)
    held = _prefilled(manager, "a", tokens)
    manager.free(_prefilled(manager, "b", _tokens(2 * BS)))
    manager.reset_prefix_cache()
    assert manager.pool.cached == {}
    assert manager.get_computed_blocks(make_request("c", tokens))[1] == 0
    manager.free(held)
    assert manager.num_free_blocks == 8


def test_prefix_stats_count_each_request_once_in_tokens() -> None:
    manager = KVCacheManager(16, BS)
    tokens = _tokens(3 * BS)
    _prefilled(manager, "a", tokens)
    second = make_request("b", tokens + _tokens(2))
    hits, num_hit = manager.get_computed_blocks(second)
    assert manager.allocate_slots(second, second.num_tokens - num_hit, hits) is not None
    stats = manager.prefix_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 3 * BS + 3 * BS + 2, 3 * BS)
    assert stats.hit_rate == pytest.approx(3 * BS / (6 * BS + 2))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="num_blocks must be at least 1"):
        KVCacheManager(0, BS)
    with pytest.raises(ValueError, match="block_size must be at least 1"):
        KVCacheManager(4, 0)
    manager = KVCacheManager(4, BS)
    with pytest.raises(ValueError, match="num_new_tokens must be at least 1"):
        manager.allocate_slots(make_request("a", [1]), 0)
