"""Adjacent decode blocks: a request's next block is the one after its last where the pool
allows (``BlockPool``'s soft reservations), without touching prefix caching's eviction
order. Driven through the real scheduler, as the engine drives it, with the fake runner
checking every position's K/V slot each step."""

from __future__ import annotations

import random

from octavo.kv.manager import KVCacheManager
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.sched.scheduler import Scheduler
from octavo.testing.seeds import draw_seed
from tests.core.scheduler_fakes import FakeRunner, make_request, make_scheduler, run_to_completion

BS = 16


class _CountingRunner:
    """Samples token 7 for every request past its prompt and checks nothing: the W1-sized
    run only looks at the block tables (the fake runner's K/V checks, quadratic in the
    context, are the tight-pool test's)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        requests = self.scheduler.requests
        sampled = [[7] if requests[r].num_computed_tokens >= requests[r].num_tokens else []
                   for r in so.num_scheduled_tokens]
        return ModelRunnerOutput(req_ids=list(so.num_scheduled_tokens), sampled_token_ids=sampled)


def _run_batch(num_blocks: int, num_requests: int, prompt_len: int, output_len: int,
               seed: int, check_kv: bool) -> tuple[dict[str, list[int]], int]:
    """A W1-like batch (distinct prompts, all admitted at once, decoding in lockstep): each
    request's largest block table, and how many preemptions the run took."""
    rng = random.Random(seed)
    scheduler = make_scheduler(num_blocks, max_model_len=prompt_len + output_len,
                               block_size=BS, max_num_seqs=num_requests)
    for i in range(num_requests):
        prompt = [rng.randrange(1000) for _ in range(prompt_len)]
        scheduler.add_request(make_request(f"r{i}", prompt, max_tokens=output_len))
    tables: dict[str, list[int]] = {}
    preempted: dict[str, int] = {}

    def record(_so: SchedulerOutput) -> None:
        for request_id, request in scheduler.requests.items():
            preempted[request_id] = request.num_preemptions
            ids = scheduler.kv_manager.get_block_ids(request_id)
            if len(ids) > len(tables.get(request_id, ())):
                tables[request_id] = ids

    runner = FakeRunner(BS) if check_kv else _CountingRunner(scheduler)
    result = run_to_completion(scheduler, runner, check=record)  # type: ignore[arg-type]
    assert all(len(tokens) == output_len for tokens in result.tokens.values())
    assert len(result.tokens) == num_requests
    manager = scheduler.kv_manager
    assert isinstance(manager, KVCacheManager)
    assert manager.num_free_blocks == num_blocks and not manager.pool._reserved
    return tables, sum(preempted.values())


def test_w1_like_batch_gets_adjacent_blocks() -> None:
    """W1's shape (64 requests, 256 + 128 tokens): with room in the pool, and with exactly
    room for all (every block used), each request's 24 blocks end up one run."""
    seed = draw_seed()
    print(f"seed={seed}")
    for num_blocks in (2048, 64 * 24):
        tables, preemptions = _run_batch(num_blocks, 64, 256, 128, seed, check_kv=False)
        assert preemptions == 0 and len(tables) == 64
        for request_id, ids in tables.items():
            assert ids == list(range(ids[0], ids[0] + 24)), (
                f"num_blocks={num_blocks}: {request_id}'s blocks are not adjacent: {ids}")


def test_a_tight_pool_still_preempts_and_recomputes() -> None:
    """Too few blocks for the batch: reservations give way (they are only soft), requests
    are preempted and recomputed, every output is complete and the fake runner's K/V
    checks hold; at the end every block is free and no reservation is left."""
    seed = draw_seed()
    print(f"seed={seed}")
    tables, preemptions = _run_batch(30, 8, 48, 48, seed, check_kv=True)
    assert preemptions > 0 and len(tables) == 8


def test_reserved_blocks_go_before_any_cached_block_is_evicted() -> None:
    """A reservation holds only uncached blocks, and once the plain free blocks are gone an
    allocation takes reserved blocks before it evicts a cached prefix."""
    manager = KVCacheManager(12, 4)
    pool = manager.pool
    cached = make_request("cached", list(range(8)), max_tokens=1)
    assert manager.allocate_slots(cached, 8) is not None  # blocks 0-1, cached
    manager.free(cached)  # to the tail, still cached
    prefix = set(pool.cached)
    grower = make_request("grower", list(range(100, 104)), max_tokens=16)
    assert manager.allocate_slots(grower, 4) is not None  # block 2, reserves 3-6
    assert [b.block_id for b in pool._reserved[("grower", b"")]] == [3, 4, 5, 6]
    other = make_request("other", list(range(200, 220)), max_tokens=1)
    new = manager.allocate_slots(other, 20)  # 7-11 are plain free: no reserved block
    assert new is not None and [b.block_id for b in new] == [7, 8, 9, 10, 11]
    # Free now: reserved 3-6, then the cached 1 and 0; 3 more blocks take reserved ones.
    third = make_request("third", list(range(300, 312)), max_tokens=1)
    new = manager.allocate_slots(third, 12)
    assert new is not None and [b.block_id for b in new] == [3, 4, 5]
    assert prefix <= set(pool.cached), "a cached prefix was evicted before a reserved block"
    assert [b.block_id for b in pool._reserved[("grower", b"")]] == [6]
