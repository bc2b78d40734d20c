"""Hybrid KV cache: sliding-window and full-attention layers in KV groups of their own.

Unit tests of the grouping, the sliding-window manager and the coordinator; the scheduler
with a coordinator under preemption (the fake runner checks group 0's cache contents);
greedy parity with HF transformers (fp32) on a tiny Qwen3 whose layers alternate sliding
(window 16) and full attention, with chunked prefill, prefix hits and preemption; the
sliding group's occupancy over a 512-token generation; and how many more 4k-token requests
one KV byte budget holds.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from octavo import LLM
from octavo.block_hash import update_block_hashes
from octavo.config import ConfigError, EngineConfig
from octavo.engine.components import build_scheduler
from octavo.kv.cache_spec import (
    FullAttentionSpec,
    KVCacheGroup,
    SlidingWindowSpec,
    kv_cache_groups,
    layers_per_group,
)
from octavo.kv.coordinator import KVCacheCoordinator
from octavo.kv.manager import KVCacheManager
from octavo.plugins import get_registries
from octavo.request import Request
from octavo.sched.scheduler import Scheduler
from octavo.testing.seeds import draw_seed
from tests.core.parity import compare, engine_greedy, hf_greedy
from tests.core.scheduler_fakes import FakeRunner, make_request, run_to_completion
from tests.core.tiny_models import VOCAB_SIZE, save_tiny_model
from tests.helpers import Records

pytestmark = pytest.mark.usefixtures("single_thread")

BS = 16
WINDOW = 16
FULL = KVCacheGroup(FullAttentionSpec(), (1, 3))
SLIDING = KVCacheGroup(SlidingWindowSpec(WINDOW), (0, 2))
GROUPS = [FULL, SLIDING]



def random_prompt(rng: np.random.Generator, length: int, vocab: int = 1000) -> list[int]:
    return rng.integers(0, vocab, size=length).tolist()


def model_prompt(rng: np.random.Generator, length: int) -> list[int]:
    """Token ids of the tiny model's vocabulary."""
    return random_prompt(rng, length, VOCAB_SIZE)


def compute(coordinator: KVCacheCoordinator, request: Request, num_tokens: int,
            chunk: int) -> None:
    """Allocate and "compute" ``num_tokens`` more tokens in chunks, as the scheduler does."""
    for start in range(0, num_tokens, chunk):
        n = min(chunk, num_tokens - start)
        assert coordinator.allocate_slots(request, n) is not None, \
            f"no room for {n} tokens of {request.request_id}"
        request.num_computed_tokens += n


# -- grouping ---------------------------------------------------------------------------------

def test_groups_split_to_equal_layer_counts() -> None:
    """vLLM's rule: layers with one spec form groups of the smaller spec's layer count
    (the larger one's when within 25%); layer j of every group shares KV tensor j."""
    alternating = kv_cache_groups([16, None, 16, None])
    assert alternating == [FULL, SLIDING]
    gemma_like = kv_cache_groups([8, 8, 8, 8, 8, None] * 2)  # 10 sliding : 2 full
    assert [g.layers for g in gemma_like] == [(5, 11), (0, 1), (2, 3), (4, 6), (7, 8), (9, 10)]
    assert layers_per_group(gemma_like) == 2
    close = kv_cache_groups([4, None] * 8 + [4])  # 9 vs 8: pad, no split
    assert [len(g.layers) for g in close] == [8, 9] and layers_per_group(close) == 9
    far = kv_cache_groups([4, None, 4, None, 4, None, 4, None, 4])  # 5 vs 4: split
    assert [len(g.layers) for g in far] == [4, 4, 1]
    assert kv_cache_groups([None] * 3) == [KVCacheGroup(FullAttentionSpec(), (0, 1, 2))]
    with pytest.raises(ValueError, match="at least 1 token"):
        kv_cache_groups([0, None])


# -- the sliding-window manager and the coordinator --------------------------------------------

def test_sliding_group_frees_blocks_outside_the_window() -> None:
    rng = np.random.default_rng(draw_seed())
    coordinator = KVCacheCoordinator(64, BS, groups=GROUPS)
    null = coordinator.null_block.block_id
    request = make_request("a", random_prompt(rng, 100))
    compute(coordinator, request, 100, chunk=32)
    full, sliding = coordinator.get_group_block_ids("a")
    assert len(full) == len(sliding) == 7  # 100 tokens: tables indexed by position // 16
    assert null not in full
    # The next token (position 100) sees 85..100: blocks 5 and 6; 0..4 are the null block.
    assert sliding[:5] == [null] * 5 and null not in sliding[5:], sliding
    assert coordinator.num_held_blocks("a") == [7, 2]
    # Decode steps move the window: at position 112 block 6 starts it, block 5 goes.
    compute(coordinator, request, 13, chunk=1)
    assert coordinator.get_group_block_ids("a")[1][:6] == [null] * 6
    assert coordinator.num_held_blocks("a") == [8, 2]
    assert coordinator.num_free_blocks == 63 - 8 - 2
    # Released full blocks stay in the prefix cache until evicted.
    sliding_keys = [coordinator.managers[1].key(h)
                    for h in update_block_hashes(request, BS)[:5]]
    assert all(coordinator.pool.get_cached_block(key) is not None for key in sliding_keys)


def test_prefix_hit_is_the_longest_prefix_every_group_has_cached() -> None:
    """vLLM's rule: full attention needs every block of the prefix, the sliding group only
    the block(s) its window needs before the hit's end - the rest are the null block."""
    rng = np.random.default_rng(draw_seed())
    coordinator = KVCacheCoordinator(64, BS, groups=GROUPS)
    null = coordinator.null_block
    prompt = random_prompt(rng, 100)
    first = make_request("a", prompt)
    compute(coordinator, first, 100, chunk=32)
    coordinator.free(first)

    second = make_request("b", prompt + random_prompt(rng, 5))
    hits, num_hit = coordinator.get_computed_blocks(second)
    assert num_hit == 6 * BS  # 6 full blocks of the shared 100 tokens
    full_hits, sliding_hits = hits[:6], hits[6:]
    assert null not in full_hits
    assert sliding_hits[:5] == [null] * 5 and sliding_hits[5] is not null
    assert coordinator.allocate_slots(second, second.num_tokens - num_hit, hits) is not None
    table = coordinator.get_group_block_ids("b")[1]
    assert table[:5] == [null.block_id] * 5 and len(table) == 7

    # A sliding block missing where the window needs it shortens the hit for every group.
    third = make_request("c", prompt + random_prompt(rng, 5))
    sliding = coordinator.managers[1]
    hashes = update_block_hashes(third, BS)
    for i in (3, 4, 5):  # evict the sliding group's blocks 3..5 of the prefix
        coordinator.pool.cached.pop(sliding.key(hashes[i])).block_hash = None
    hits, num_hit = coordinator.get_computed_blocks(third)
    # Sliding blocks 0..2 were released long ago but are still cached: block 2 serves a
    # hit of 3 blocks, and the full group's is cut to those.
    assert num_hit == 3 * BS and len(hits) == 6
    assert null not in hits[:3]
    assert hits[3:5] == [null] * 2 and hits[5] is not null


def test_allocation_is_all_or_nothing_across_groups() -> None:
    """The full group alone would fit, both groups do not: None, and nothing changed."""
    rng = np.random.default_rng(draw_seed())
    coordinator = KVCacheCoordinator(12, BS, groups=GROUPS)  # 11 usable blocks
    request = make_request("a", random_prompt(rng, 96))
    before_free = [block.block_id for block in coordinator.pool.free_queue]
    before_cached = dict(coordinator.pool.cached)
    assert coordinator.allocate_slots(request, 96) is None  # 6 + 6 > 11, though 6 <= 11
    assert [block.block_id for block in coordinator.pool.free_queue] == before_free
    assert coordinator.pool.cached == before_cached
    assert coordinator.get_group_block_ids("a") == [[], []]
    assert coordinator.prefix_stats.requests == 0
    # In chunks it fits: the sliding group releases what falls out of its window.
    compute(coordinator, request, 96, chunk=16)
    assert coordinator.num_held_blocks("a") == [6, 2]


@pytest.mark.parametrize("usable", [7, 6])
def test_released_blocks_count_as_free_for_the_check(usable: int) -> None:
    """A decode at position 64 needs block 4 in both groups and moves the window past
    block 2: with 1 free block the release makes room; with none it does not, and then
    nothing - not even the release - happens."""
    rng = np.random.default_rng(draw_seed())
    coordinator = KVCacheCoordinator(usable + 1, BS, groups=GROUPS)
    request = make_request("a", random_prompt(rng, 64), max_tokens=100)
    compute(coordinator, request, 64, chunk=16)
    assert coordinator.num_held_blocks("a") == [4, 2]  # sliding: blocks 2 and 3
    assert coordinator.num_free_blocks == usable - 6
    before = coordinator.get_group_block_ids("a")
    new = coordinator.allocate_slots(request, 1)
    if usable == 7:
        assert new is not None and coordinator.num_held_blocks("a") == [5, 2]
        assert coordinator.num_free_blocks == 0
    else:
        assert new is None and coordinator.get_group_block_ids("a") == before


def test_free_releases_every_group() -> None:
    """What preemption and finishing do: every block of every group goes back."""
    rng = np.random.default_rng(draw_seed())
    coordinator = KVCacheCoordinator(40, BS, groups=GROUPS)
    a, b = make_request("a", random_prompt(rng, 70)), make_request("b", random_prompt(rng, 50))
    compute(coordinator, a, 70, chunk=24)
    compute(coordinator, b, 50, chunk=50)
    coordinator.free(a)
    assert coordinator.get_group_block_ids("a") == [[], []]
    held_b = sum(coordinator.num_held_blocks("b"))
    assert coordinator.num_free_blocks == 39 - held_b
    coordinator.free(b)
    assert coordinator.num_free_blocks == 39 and coordinator.usage == 0.0


def test_scheduler_with_groups_preempts_and_recomputes_identically() -> None:
    """The real scheduler over a coordinator: a pool too small for all requests preempts,
    and every request's tokens equal those of an ample pool (the fake runner checks each
    request's full-attention context slots every step)."""
    rng = np.random.default_rng(draw_seed())
    prompts = [random_prompt(rng, int(n)) for n in rng.integers(20, 90, 6)]

    def run(num_blocks: int) -> tuple[dict, int]:
        config = EngineConfig.from_kwargs(max_model_len=256, max_num_batched_tokens=32,
                                          block_size=BS)
        config.cache.num_gpu_blocks = num_blocks
        scheduler = build_scheduler(config, get_registries(), None, GROUPS)
        assert isinstance(scheduler, Scheduler)
        assert isinstance(scheduler.kv_manager, KVCacheCoordinator)
        for i, prompt in enumerate(prompts):
            scheduler.add_request(make_request(f"r{i}", prompt, max_tokens=30))
        preempted = 0
        original = scheduler._preempt

        def counting(request: Request) -> None:
            nonlocal preempted
            preempted += 1
            original(request)

        scheduler._preempt = counting  # type: ignore[method-assign]
        result = run_to_completion(scheduler, FakeRunner(BS))
        assert scheduler.kv_manager.usage == 0.0
        return result.tokens, preempted

    ample, _ = run(200)
    tight, preemptions = run(24)
    assert tight == ample
    assert preemptions > 0


# -- a tiny hybrid model against HF transformers -----------------------------------------------

HYBRID_LAYERS = ["sliding_attention", "full_attention"] * 2


def save_hybrid(folder: Path, seed: int, layer_types: list[str] = HYBRID_LAYERS):  # type: ignore[no-untyped-def]
    return save_tiny_model("qwen3", folder, seed, num_hidden_layers=len(layer_types),
                           layer_types=list(layer_types), use_sliding_window=True,
                           sliding_window=WINDOW, max_window_layers=0,
                           max_position_embeddings=1024)


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    seed = draw_seed()
    folder = tmp_path_factory.mktemp("hybrid")
    return folder, save_hybrid(folder, seed), seed


def coordinator_of(llm: LLM) -> KVCacheCoordinator:
    manager = llm.llm_engine.core.scheduler.kv_manager
    assert isinstance(manager, KVCacheCoordinator)
    return manager


def test_hybrid_model_matches_hf_with_chunks_prefix_hits_and_preemption(hybrid_model) -> None:  # type: ignore[no-untyped-def]
    folder, hf_model, seed = hybrid_model
    rng = np.random.default_rng(seed)
    shared = model_prompt(rng, 50)
    prompts = [shared + model_prompt(rng, int(n)) for n in (7, 20, 33)]
    prompts += [model_prompt(rng, int(n)) for n in (3, 40, 90)]
    # 30 blocks of 2 layer pages: fewer than the six requests need at once.
    llm = LLM(model=str(folder), dtype="float32", max_num_batched_tokens=32, max_num_seqs=6,
              max_model_len=160, kv_cache_memory=30 * 2 * 2 * BS * 2 * 32 * 4)
    coordinator = coordinator_of(llm)
    assert coordinator.num_blocks == 29
    scheduler = llm.llm_engine.core.scheduler
    preempted = []
    original = scheduler._preempt

    def counting(request: Request) -> None:
        preempted.append(request.request_id)
        original(request)

    scheduler._preempt = counting
    ours = engine_greedy(llm, prompts, 48)
    reference = [hf_greedy(hf_model, p, 48) for p in prompts]
    report = compare(prompts, ours, reference)
    stats = coordinator.prefix_stats
    print(f"\nhybrid tiny qwen3 (seed {seed}): max logit diff {report.max_logit_diff:.2e}, "
          f"{len(preempted)} preemptions, prefix hits {stats.hits}/{stats.queries} tokens; "
          f"ties: {report.divergences or 'none'}")
    assert not report.failures, f"seed {seed}: {report.failures}"
    assert report.max_logit_diff < 1e-3, f"seed {seed}"
    assert preempted, "the KV budget was meant to force preemption"
    assert stats.hits >= 48, stats  # the second shared-prefix request hits 3 blocks
    assert coordinator.usage == 0.0


def test_sliding_group_holds_its_window_over_a_long_generation(hybrid_model) -> None:  # type: ignore[no-untyped-def]
    """512 generated tokens: the sliding group never holds more than ceil(16 / 16) + 1
    blocks while decoding, while the full group holds them all; tokens match HF."""
    folder, hf_model, seed = hybrid_model
    rng = np.random.default_rng(seed + 1)
    prompts = [model_prompt(rng, 37)]
    records = Records()
    logging.getLogger("octavo.engine.core").addHandler(records)
    try:
        llm = LLM(model=str(folder), dtype="float32", max_num_batched_tokens=32,
                  max_num_seqs=2, max_model_len=600, kv_cache_memory=2**21)
    finally:
        logging.getLogger("octavo.engine.core").removeHandler(records)
    logged = " ".join(record.getMessage() for record in records.records)
    assert ("2 KV groups (group 0: full attention, layers 1, 3; group 1: sliding window 16, "
            "layers 0, 2)") in logged, logged
    # 2 MiB of 2-layer blocks (16 KiB each): 128, less the null block, of 16 tokens.
    assert "the cache holds 2032 tokens of full-attention context" in logged, logged
    coordinator = coordinator_of(llm)
    scheduler = llm.llm_engine.core.scheduler
    most = [0, 0]
    original = scheduler.schedule

    def observing():  # type: ignore[no-untyped-def]
        output = original()
        for request in scheduler.running:
            if request.num_computed_tokens > request.num_prompt_tokens:  # decoding
                full, sliding = coordinator.num_held_blocks(request.request_id)
                assert full == -(-request.num_computed_tokens // BS)
                most[0] = max(most[0], sliding)
                most[1] = max(most[1], full)
        return output

    scheduler.schedule = observing
    ours = engine_greedy(llm, prompts, 512)
    reference = [hf_greedy(hf_model, p, 512) for p in prompts]
    report = compare(prompts, ours, reference)
    bound = -(-WINDOW // BS) + 1
    print(f"\n512-token generation: the sliding group held at most {most[0]} blocks per "
          f"request (bound {bound}), the full group up to {most[1]}; max logit diff "
          f"{report.max_logit_diff:.2e}")
    assert not report.failures, f"seed {seed}: {report.failures}"
    assert 0 < most[0] <= bound
    assert most[1] >= (37 + 500) // BS


def test_refuses_what_groups_do_not_support(hybrid_model) -> None:  # type: ignore[no-untyped-def]
    folder, _, _ = hybrid_model
    with pytest.raises(ConfigError, match="KV groups .* speculative decoding"):
        LLM(model=str(folder), dtype="float32", kv_cache_memory=2**20,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2})


def test_a_kv_budget_holds_as_many_more_4k_requests_as_the_layer_mix_predicts(
        hybrid_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One KV byte budget, sized by each model's own runner: the uniform twin (every layer
    full attention) and the hybrid one. Requests of 4096 prompt tokens are prefilled in
    512-token chunks and given one decode slot, one after another, until one no longer
    fits. The hybrid cache's block spans 2 layer pages instead of 4, and a request needs
    257 full blocks plus 2 sliding ones instead of 257: predicted 4 * 257 / (2 * 259)."""
    folder, _, seed = hybrid_model
    save_hybrid(tmp_path, seed, ["full_attention"] * 4)
    hybrid = LLM(model=str(folder), dtype="float32", kv_cache_memory=2**22)
    uniform = LLM(model=str(tmp_path), dtype="float32", kv_cache_memory=2**22)
    hybrid_runner = hybrid.llm_engine.core.executor.worker.runner
    uniform_runner = uniform.llm_engine.core.executor.worker.runner
    assert isinstance(uniform.llm_engine.core.scheduler.kv_manager, KVCacheManager)
    budget = 100 * 257 * uniform_runner.kv_cache_bytes_per_block()
    groups = kv_cache_groups(hybrid.llm_engine.core.executor.worker.get_kv_cache_spec())

    def concurrent(bytes_per_block: int, kv_groups: list[KVCacheGroup]) -> int:
        config = EngineConfig.from_kwargs(max_model_len=8192, block_size=BS)
        config.cache.num_gpu_blocks = budget // bytes_per_block
        manager = build_scheduler(config, get_registries(), None, kv_groups).kv_manager
        rng = np.random.default_rng(seed)
        for count in range(10_000):
            request = make_request(f"r{count}", random_prompt(rng, 4096))
            for _ in range(4096 // 512):
                if manager.allocate_slots(request, 512) is None:
                    return count
                request.num_computed_tokens += 512
            if manager.allocate_slots(request, 1) is None:
                return count
        raise AssertionError("the budget never filled")

    n_uniform = concurrent(uniform_runner.kv_cache_bytes_per_block(),
                           kv_cache_groups([None] * 4))
    n_hybrid = concurrent(hybrid_runner.kv_cache_bytes_per_block(), groups)
    predicted = (4 * 257) / (layers_per_group(groups) * (257 + 2))
    measured = n_hybrid / n_uniform
    print(f"\nconcurrent 4k-token requests in {budget} bytes: uniform {n_uniform}, hybrid "
          f"{n_hybrid}: measured factor {measured:.3f}, predicted {predicted:.3f}")
    assert n_uniform == 100
    assert abs(measured - predicted) / predicted < 0.02
