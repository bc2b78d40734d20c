"""Scheduler: budgets, chunked prefill, preemption, priorities, abort, prefix hits - driven
by a fake runner that checks every K/V it reads (tests/core/scheduler_fakes.py)."""

from __future__ import annotations

import random

import pytest

from octavo.config import ConfigError, SchedulerConfig
from octavo.engine.core import check_kv_fits
from octavo.outputs import EngineCoreEventType, SchedulerOutput
from octavo.plugins import RegistryError, get_registries
from octavo.request import RequestStatus
from octavo.sched.policy import PriorityPolicy
from octavo.sched.scheduler import Scheduler
from octavo.testing.seeds import draw_seed
from tests.core.scheduler_fakes import FakeRunner, make_request, make_scheduler, run_to_completion

BS = 4


def _scheduler(**overrides) -> Scheduler:
    config = dict(num_blocks=256, max_model_len=256, block_size=BS, max_num_seqs=8,
                  max_num_batched_tokens=64)
    config.update(overrides)
    return make_scheduler(**config)


def _fresh_rng() -> tuple[int, random.Random]:
    seed = draw_seed()
    print(f"seed={seed}")
    return seed, random.Random(seed)


def _random_requests(rng: random.Random, n: int, max_prompt: int, max_output: int,
                     shared: list[int] | None = None):
    requests = []
    for i in range(n):
        prefix = shared[:rng.randrange(len(shared) + 1)] if shared else []
        prompt = prefix + [rng.randrange(1000) for _ in range(rng.randrange(1, max_prompt))]
        requests.append(make_request(f"r{i}", prompt, max_tokens=rng.randrange(1, max_output)))
    return requests


def _run(scheduler: Scheduler, requests, check=None):
    for request in requests:
        scheduler.add_request(request)
    return run_to_completion(scheduler, FakeRunner(scheduler.config.cache.block_size), check=check)


def test_token_budget_and_max_num_seqs_hold_every_step() -> None:
    seed, rng = _fresh_rng()
    scheduler = _scheduler(max_num_seqs=5, max_num_batched_tokens=48)
    requests = _random_requests(rng, 30, 120, 20)

    def check(so: SchedulerOutput) -> None:
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values())
        assert so.total_num_scheduled_tokens <= 48, f"seed={seed}"
        assert len(so.num_scheduled_tokens) <= 5, f"seed={seed}"
        assert len(scheduler.running) <= 5, f"seed={seed}"

    result = _run(scheduler, requests, check)
    for request in requests:
        params = request.sampling_params
        assert len(result.tokens[request.request_id]) == params.max_tokens, f"seed={seed}"
    # Requests were actually batched together, up to the cap.
    assert max(len(so.num_scheduled_tokens) for so in result.schedules) == 5, f"seed={seed}"
    assert scheduler.kv_manager.num_free_blocks == scheduler.config.cache.num_gpu_blocks


def test_a_prompt_longer_than_the_budget_is_chunked() -> None:
    scheduler = _scheduler(max_num_batched_tokens=32)
    prompt = [random.randrange(1000) for _ in range(100)]
    result = _run(scheduler, [make_request("long", prompt, max_tokens=3)])
    assert [so.num_scheduled_tokens["long"] for so in result.schedules] == [32, 32, 32, 4, 1, 1]
    assert [len(so.scheduled_new_reqs) for so in result.schedules] == [1, 0, 0, 0, 0, 0]
    # Tokens come only once the prefill is complete.
    assert [len(out.new_token_ids) for out in result.outputs["long"]] == [1, 1, 1]


def test_steps_in_flight_share_the_token_budget() -> None:
    """With k steps in flight (pipeline micro-batches) a step takes 1/k of the budget, so a
    burst of prompts fills the pipeline after a fraction of a step; one at a time, all of it."""
    for steps_in_flight, first_chunk in ((1, 64), (2, 32), (3, 21)):
        scheduler = _scheduler()
        scheduler.steps_in_flight = steps_in_flight  # as the engine core sets it
        scheduler.add_request(make_request("long", list(range(100))))
        assert scheduler.schedule().num_scheduled_tokens == {"long": first_chunk}


def test_samples_returned_for_a_partial_prefill_are_ignored() -> None:
    """A runner that samples every request's last position (a mid-prompt one, for a chunk)
    must not leak those tokens into the output."""

    class SamplesEverything(FakeRunner):
        def execute(self, so):
            output = super().execute(so)
            output.sampled_token_ids = [t or [123] for t in output.sampled_token_ids]
            return output

    prompt = [random.randrange(1000) for _ in range(50)]
    tokens = {}
    for runner in (FakeRunner(BS), SamplesEverything(BS)):
        scheduler = _scheduler(max_num_batched_tokens=16)
        scheduler.add_request(make_request("a", prompt, max_tokens=3))
        tokens[type(runner)] = run_to_completion(scheduler, runner).tokens["a"]
    assert tokens[SamplesEverything] == tokens[FakeRunner]


def test_decodes_go_first_and_a_new_prompt_takes_what_the_budget_leaves() -> None:
    scheduler = _scheduler(max_num_batched_tokens=16)
    scheduler.add_request(make_request("a", list(range(10)), max_tokens=4))
    runner = FakeRunner(BS)
    scheduler.update_from_output(so := scheduler.schedule(), runner.execute(so))
    scheduler.add_request(make_request("b", list(range(50, 90)), max_tokens=4))
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "b": 15}


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_gives_the_same_outputs_as_an_ample_pool(policy: str) -> None:
    seed, rng = _fresh_rng()
    shared = [rng.randrange(1000) for _ in range(24)]
    requests = _random_requests(rng, 14, 40, 40, shared)
    for request in requests:
        request.priority = rng.randrange(3)
    results = {}
    for num_blocks, caching in ((256, True), (20, True), (20, False)):
        copies = [make_request(r.request_id, r.prompt_token_ids,
                               max_tokens=r.sampling_params.max_tokens, priority=r.priority,
                               arrival_time=r.arrival_time) for r in requests]
        scheduler = _scheduler(num_blocks=num_blocks, max_model_len=80, scheduling_policy=policy,
                               enable_prefix_caching=caching, max_num_batched_tokens=32)
        results[num_blocks, caching] = _run(scheduler, copies).tokens
        preemptions = sum(r.num_preemptions for r in copies)
        assert (preemptions > 0) == (num_blocks == 20), f"seed={seed}: {preemptions}"
        assert scheduler.kv_manager.num_free_blocks == num_blocks
    assert results[20, True] == results[256, True], f"seed={seed}"
    assert results[20, False] == results[256, True], f"seed={seed}"


def test_preemption_takes_the_least_valued_request_and_reports_it() -> None:
    # 4 requests of 8 prompt tokens fill 8 of 9 blocks; the next block runs out.
    scheduler = _scheduler(num_blocks=9, max_model_len=36, scheduling_policy="priority")
    for i, (name, priority) in enumerate((("a", 1), ("b", 3), ("c", 0), ("d", 2))):
        scheduler.add_request(make_request(name, list(range(10 * i, 10 * i + 8)),
                                           max_tokens=20, priority=priority))
    runner = FakeRunner(BS)
    outputs = []
    while True:
        so = scheduler.schedule()
        if any(r.num_preemptions for r in scheduler.requests.values()):
            break
        outputs += scheduler.update_from_output(so, runner.execute(so))
    victims = [r.request_id for r in scheduler.requests.values() if r.num_preemptions]
    assert victims == ["b"]
    assert scheduler.requests["b"].status is RequestStatus.PREEMPTED
    assert scheduler.requests["b"] in scheduler.waiting
    assert "b" in so.finished_req_ids  # workers drop its state
    assert sorted(so.num_scheduled_tokens) == ["a", "c", "d"]
    outputs += scheduler.update_from_output(so, runner.execute(so))
    while "b" not in so.num_scheduled_tokens:  # it comes back once there is room
        so = scheduler.schedule()
        outputs += scheduler.update_from_output(so, runner.execute(so))
    events = [e.type for out in outputs if out.request_id == "b" for e in out.events]
    assert EngineCoreEventType.PREEMPTED in events


def test_a_higher_priority_request_admitted_later_is_not_the_victim() -> None:
    # L and H hold 2 blocks each; at step 3 both need a third and one block is free.
    scheduler = _scheduler(num_blocks=5, max_model_len=20, scheduling_policy="priority")
    runner = FakeRunner(BS)
    low = make_request("L", list(range(7)), max_tokens=10, priority=5)
    high = make_request("H", list(range(50, 58)), max_tokens=10, priority=0)
    scheduler.add_request(low)
    for step in range(3):
        if step == 1:
            scheduler.add_request(high)
        so = scheduler.schedule()
        scheduler.update_from_output(so, runner.execute(so))
    assert (low.num_preemptions, high.num_preemptions) == (1, 0)
    assert list(so.num_scheduled_tokens) == ["H"]


def test_nothing_is_admitted_in_a_step_that_preempted() -> None:
    """Preempting frees blocks; they must not go to a waiting request in the same step (that
    would just trade one request for another and thrash)."""
    scheduler = _scheduler(num_blocks=9, max_model_len=36, max_num_seqs=2,
                           scheduling_policy="priority")
    runner = FakeRunner(BS)
    scheduler.add_request(make_request("A", list(range(8)), max_tokens=10, priority=0))
    scheduler.add_request(make_request("B", list(range(50, 74)), max_tokens=10, priority=2))
    so = scheduler.schedule()  # A: 2 blocks, B: 6 blocks, 1 free
    scheduler.update_from_output(so, runner.execute(so))
    scheduler.add_request(make_request("C", [99, 98, 97], max_tokens=10, priority=1))
    so = scheduler.schedule()  # A takes the last block; B finds none and preempts itself
    assert scheduler.requests["B"].num_preemptions == 1
    assert scheduler.kv_manager.num_free_blocks == 6  # room for C, yet C waits a step
    assert so.scheduled_new_reqs == [] and list(so.num_scheduled_tokens) == ["A"]
    scheduler.update_from_output(so, runner.execute(so))
    so = scheduler.schedule()
    assert [new.req_id for new in so.scheduled_new_reqs] == ["C"]


def test_victims_are_never_requests_already_scheduled_this_step() -> None:
    """A plugin policy may pick any victim; the scheduler offers only unscheduled ones, whose
    blocks this step's forward pass does not write."""

    class PreemptTheBest(PriorityPolicy):
        def pick_victim(self, running):
            return min(running, key=self.sort_key)

    seed, rng = _fresh_rng()
    scheduler = _scheduler(num_blocks=20, max_model_len=80, max_num_batched_tokens=32)
    scheduler.policy = PreemptTheBest()
    result = _run(scheduler, _random_requests(rng, 14, 40, 40))
    assert sum(len(so.finished_req_ids) for so in result.schedules) > 14, f"seed={seed}"


@pytest.mark.parametrize("policy, expected", [("priority", ["d", "b", "c", "a"]),
                                              ("fcfs", ["a", "b", "c", "d"])])
def test_waiting_requests_are_served_in_policy_order(policy: str, expected: list[str]) -> None:
    scheduler = _scheduler(max_num_seqs=1, scheduling_policy=policy)
    for i, (name, priority) in enumerate((("a", 3), ("b", 1), ("c", 2), ("d", 0))):
        scheduler.add_request(make_request(name, [i + 1] * 5, max_tokens=2, priority=priority,
                                           arrival_time=float(i)))
    result = run_to_completion(scheduler, FakeRunner(BS))
    assert result.finish_order == expected


def test_abort_frees_blocks_and_tells_the_workers() -> None:
    scheduler = _scheduler(max_num_seqs=2, max_num_batched_tokens=16)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", list(range(i, i + 20)), max_tokens=50))
    runner = FakeRunner(BS)
    for _ in range(3):
        so = scheduler.schedule()
        scheduler.update_from_output(so, runner.execute(so))
    assert scheduler.kv_manager.num_free_blocks < scheduler.config.cache.num_gpu_blocks
    scheduler.finish_requests(["r0", "r3", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert len(scheduler.requests) == 2
    scheduler.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
    scheduler.finish_requests(["r2"], RequestStatus.FINISHED_ABORTED)
    assert not scheduler.has_unfinished_requests() and scheduler.finished_req_ids
    assert scheduler.kv_manager.num_free_blocks == scheduler.config.cache.num_gpu_blocks
    so = scheduler.schedule()
    assert so.finished_req_ids == {"r0", "r1", "r2", "r3"} and so.num_scheduled_tokens == {}
    with pytest.raises(ValueError, match="needs a finished status"):
        scheduler.finish_requests(["r0"], RequestStatus.RUNNING)


def test_abort_during_a_step_drops_that_steps_tokens() -> None:
    scheduler = _scheduler()
    scheduler.add_request(make_request("a", [1, 2, 3], max_tokens=5))
    runner = FakeRunner(BS)
    so = scheduler.schedule()
    runner_output = runner.execute(so)
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert scheduler.update_from_output(so, runner_output) == []


def test_shared_prefix_hits_cover_the_prefix_after_the_first_request() -> None:
    """W3-like: 32 requests sharing a 512-token prefix, arriving together."""
    _, rng = _fresh_rng()
    shared = [rng.randrange(100, 49_000) for _ in range(512)]
    requests = [make_request(f"w{i}", shared + [rng.randrange(100, 49_000) for _ in range(32)],
                             max_tokens=4) for i in range(32)]
    scheduler = _scheduler(num_blocks=2048, max_model_len=1024, block_size=16,
                           max_num_seqs=256, max_num_batched_tokens=8192)
    result = _run(scheduler, requests)
    cached = [result.outputs[r.request_id][-1].num_cached_tokens for r in requests]
    assert cached[0] == 0
    assert all(n >= 0.9 * 512 for n in cached[1:]), cached
    stats = scheduler.make_stats().prefix_cache
    assert stats.hits >= 0.9 * 512 * 31 and stats.requests == 32
    assert stats.hit_rate == pytest.approx(stats.hits / (32 * 544))


def test_prefix_caching_off_gives_no_hits_and_the_same_tokens() -> None:
    _, rng = _fresh_rng()
    shared = [rng.randrange(1000) for _ in range(40)]
    requests = _random_requests(rng, 10, 20, 10, shared)
    runs = {}
    for caching in (True, False):
        copies = [make_request(r.request_id, r.prompt_token_ids,
                               max_tokens=r.sampling_params.max_tokens) for r in requests]
        scheduler = _scheduler(enable_prefix_caching=caching)
        result = _run(scheduler, copies)
        runs[caching] = result.tokens
        cached = sum(outs[-1].num_cached_tokens for outs in result.outputs.values())
        assert (cached > 0) == caching
    assert runs[True] == runs[False]


def test_outputs_carry_events_in_order() -> None:
    scheduler = _scheduler()
    scheduler.add_request(make_request("a", [5] * 6, max_tokens=2))
    result = run_to_completion(scheduler, FakeRunner(BS))
    first, last = result.outputs["a"]
    assert [e.type for e in first.events] == [EngineCoreEventType.QUEUED,
                                              EngineCoreEventType.SCHEDULED,
                                              EngineCoreEventType.FIRST_TOKEN]
    stamps = [e.timestamp for e in first.events]
    assert stamps == sorted(stamps)
    assert last.events == [] and last.finish_reason == "length"


def test_stats_report_queues_and_usage() -> None:
    scheduler = _scheduler(max_num_seqs=1, num_blocks=64)
    for i in range(3):
        scheduler.add_request(make_request(f"r{i}", list(range(8)), max_tokens=4))
    scheduler.schedule()
    stats = scheduler.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (1, 2)
    assert stats.kv_cache_usage == pytest.approx(2 / 64)


def test_default_scheduler_and_kv_manager_are_registered() -> None:
    registries = get_registries()
    assert registries.schedulers.get("default") is Scheduler
    from octavo.kv.manager import KVCacheManager

    assert registries.kv_managers.get("default") is KVCacheManager


def test_bad_config_and_requests_are_refused_with_clear_errors() -> None:
    with pytest.raises(ConfigError, match="max_num_seqs must be a positive integer"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ConfigError, match="needs 4 blocks: raise --kv-cache-memory"):
        check_kv_fits(num_blocks=2, block_size=16, max_model_len=64)
    with pytest.raises(RegistryError, match="unknown scheduling policy 'lifo'"):
        _scheduler(scheduling_policy="lifo")
    scheduler = _scheduler(max_model_len=16, num_blocks=8)
    scheduler.add_request(make_request("a", [1]))
    with pytest.raises(ValueError, match="'a' is already in the scheduler"):
        scheduler.add_request(make_request("a", [1]))
    with pytest.raises(ValueError, match="between 1 and max_model_len"):
        scheduler.add_request(make_request("b", []))
    with pytest.raises(ValueError, match="the prompt has 17 tokens"):
        scheduler.add_request(make_request("c", [1] * 17))
