"""The KV manager under speculative decoding: drafts scheduled with lookahead, rejected
drafts rolled back and their trailing blocks released - mixed into the random operation
sequences of tests/core/kv/test_kv_manager.py and checked with its invariant checker
(prefix hits must hold exactly the tokens they stand for)."""

from __future__ import annotations

import random

import pytest

from octavo.kv.manager import KVCacheManager
from octavo.request import Request
from octavo.testing.seeds import draw_seed
from tests.core.kv.test_kv_manager import BS, NUM_BLOCKS, _step, _World

K = 4


def _speculate(world: _World, rng: random.Random, request: Request) -> None:
    """One decode step with drafts: the newest token plus 1..K drafts are computed, a
    random number of drafts is accepted, the rest is rolled back and released."""
    request.output_token_ids.append(rng.randrange(1000))  # sampled by the previous step
    drafts = [rng.randrange(1000) for _ in range(rng.randrange(1, K + 1))]
    start = request.num_computed_tokens
    if world.manager.allocate_slots(request, 1 + len(drafts), num_lookahead_tokens=K) is None:
        world.free(request)
        return
    blocks = world.blocks_of(request)
    tokens = request.all_token_ids + drafts
    for pos in range(start, start + 1 + len(drafts)):  # the forward pass writes the drafts too
        block = blocks[pos // BS]
        assert block.ref_cnt == 1, f"a draft is written into shared block {block.block_id}"
        world.content.setdefault(block.block_id, {})[pos % BS] = tuple(tokens[:pos + 1])
    accepted = rng.randrange(len(drafts) + 1)
    request.output_token_ids.extend(drafts[:accepted])
    request.num_computed_tokens = start + 1 + accepted
    held = world.blocks_of(request)
    # Keep room for the token the verification samples (it arrives with the next step).
    kept = world.manager.free_trailing_blocks(request, request.num_tokens + 1)
    released = held[kept:] if kept is not None else []
    assert all(b.block_hash is None for b in released), "a released block was in the cache"
    assert all(b.ref_cnt == 0 for b in released)
    assert len(world.blocks_of(request)) == -(-(request.num_tokens + 1) // BS) or kept is None


@pytest.mark.parametrize("enable_caching", [True, False])
def test_drafts_rollbacks_and_releases_keep_invariants(enable_caching: bool) -> None:
    seed = draw_seed()
    rng = random.Random(seed)
    for _ in range(3):
        world = _World(KVCacheManager(NUM_BLOCKS, BS, enable_caching=enable_caching))
        prefixes = [[rng.randrange(1000) for _ in range(4 * BS)] for _ in range(3)]
        num_spec = 0
        for serial in range(500):
            decoding = [r for r in world.live.values()
                        if r.num_computed_tokens == r.num_tokens]
            if decoding and rng.random() < 0.4:
                _speculate(world, rng, rng.choice(sorted(decoding, key=lambda r: r.request_id)))
                num_spec += 1
            else:
                _step(world, rng, prefixes, serial)
            world.check_invariants()
        assert num_spec > 50, f"seed={seed}"
        assert (world.manager.prefix_stats.hits > 0) == enable_caching, f"seed={seed}"
        for request in list(world.live.values()):
            world.free(request)
        world.check_invariants()
        assert world.manager.num_free_blocks == NUM_BLOCKS, f"seed={seed}"


def test_free_trailing_blocks_keeps_what_the_tokens_need() -> None:
    from tests.core.scheduler_fakes import make_request

    manager = KVCacheManager(NUM_BLOCKS, BS)
    request = make_request("r", list(range(5)))
    manager.allocate_slots(request, 5, num_lookahead_tokens=2 * BS)  # 5 + 8 slots: 4 blocks
    assert len(manager.get_block_ids("r")) == 4
    free_before = manager.num_free_blocks
    assert manager.free_trailing_blocks(request, 6) == 2
    assert manager.num_free_blocks == free_before + 2
    assert manager.free_trailing_blocks(request, 6) is None  # nothing left to release
