"""Pipeline micro-batches (``mp`` executor, PP=2): two steps in flight, one per stage, must
give the same fp32 greedy tokens as one rank, with preemption forced by a small KV cache and
prefix caching on; a step that raises with
steps in flight fails their requests and no others; a stage killed with steps in flight
fails every request in flight and leaves no future unresolved and nothing hanging.

The KV cache is sized in blocks of SmolLM2-135M (30 layers, 3 KV heads of 64, fp32): each
PP rank holds half the layers of every block, so it gets half the bytes, and both runs hold
the same number of blocks.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from octavo import LLM, SamplingParams
from octavo.bench.workloads import build_workload
from octavo.config import ConfigError, EngineConfig
from octavo.engine.batch_queue import BatchQueue
from octavo.engine.core import check_steps_in_flight_supported
from octavo.engine.errors import StepError
from octavo.executor.base import WorkerDiedError
from octavo.models.loader import default_model_path
from octavo.testing.seeds import draw_seed

from ..core.engine.failing_scheduler import FAIL_STEP, FailingScheduler
from ..core.tiny_models import save_tiny_model
from .engines import one_thread

BLOCK_BYTES = 16 * 2 * 3 * 64 * 4 * 30  # 16 tokens, K and V, 3 KV heads of 64, fp32, 30 layers
NUM_BLOCKS = 96  # 6 prompts of 256 tokens (16 blocks each): preemptions once they decode
ENGINE: dict[str, Any] = dict(dtype="float32", max_model_len=320, seed=0,
                              enable_prefix_caching=True)
MICRO_BATCHES = dict(pipeline_parallel_size=2, enable_pipeline_micro_batching=True)
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
FAILING_SCHEDULER = f"{FailingScheduler.__module__}.{FailingScheduler.__name__}"


def make_llm(ranks: int, **engine: Any) -> LLM:
    return LLM(str(default_model_path()), kv_cache_memory=NUM_BLOCKS * BLOCK_BYTES // ranks,
               **(ENGINE | engine))


@pytest.fixture(scope="module")
def prompts() -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": p} for p in build_workload("W1_throughput").prompts[:16]]


def test_micro_batches_match_one_rank_with_preemption(prompts, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with one_thread():
        llm = make_llm(1)
        try:
            reference = llm.generate(prompts, GREEDY, use_tqdm=False)
        finally:
            llm.shutdown()
    peak = [0]
    push = BatchQueue.push

    def counting_push(queue: BatchQueue, step: Any) -> None:
        push(queue, step)
        peak[0] = max(peak[0], len(queue))

    monkeypatch.setattr(BatchQueue, "push", counting_push)
    llm = make_llm(2, **MICRO_BATCHES)
    try:
        assert llm.llm_engine.core.executor.max_concurrent_batches == 2
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == \
        [o.outputs[0].token_ids for o in reference]
    assert peak[0] == 2, "never two steps in flight"
    for run in (reference, outputs):
        assert sum(o.metrics.num_preemptions for o in run) > 0, "no preemption was forced"


def test_failures_with_steps_in_flight(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A step that raises fails its requests and those of the step in flight behind it,
    not the waiting one, and the engine goes on; then a stage killed with steps in flight:
    ``WorkerDiedError`` within seconds, every future resolved, the queue empty."""
    save_tiny_model("llama", tmp_path, seed=draw_seed())
    futures: list[Any] = []
    push = BatchQueue.push

    def recording_push(queue: BatchQueue, step: Any) -> None:
        push(queue, step)
        futures.append(step.future)

    monkeypatch.setattr(BatchQueue, "push", recording_push)
    # A step never looks done when it is sent: the core fills the queue before it waits.
    monkeypatch.setattr(BatchQueue, "oldest_done", lambda queue: False)
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=1 << 22, max_num_seqs=2,
              scheduler_cls=FAILING_SCHEDULER, **MICRO_BATCHES)
    engine, core = llm.llm_engine, llm.llm_engine.core
    try:
        engine.add_request({"prompt_token_ids": [5, 6, 7, 8]}, PARAMS, f"{FAIL_STEP}-a")
        assert core.step() == []  # step 1 (a) in flight
        engine.add_request({"prompt_token_ids": [9, 10, 11]}, PARAMS, "b")
        engine.add_request({"prompt_token_ids": [12, 13]}, PARAMS, "c")
        with pytest.raises(StepError) as failed:
            core.step()  # step 2 (b) sent, step 1 applied: it raises
        assert failed.value.request_ids == [f"{FAIL_STEP}-a", "b"]
        assert all(future.done() for future in futures) and not core.batch_queue
        finished = run_to_end(core)
        assert finished == {"c": PARAMS.max_tokens}
        assert not core.scheduler.in_flight and core.scheduler.kv_manager.usage == 0.0

        engine.add_request({"prompt_token_ids": [5, 6, 7]}, PARAMS, "d")
        assert core.step() == []
        os.kill(core.executor.procs[1].pid, signal.SIGKILL)
        engine.add_request({"prompt_token_ids": [8, 9, 10]}, PARAMS, "e")
        deadline = time.monotonic() + 30
        with pytest.raises(WorkerDiedError):
            while time.monotonic() < deadline:
                core.step()
        assert all(future.done() for future in futures) and not core.batch_queue
    finally:
        llm.shutdown()


def run_to_end(core: Any) -> dict[str, int]:
    """Step until nothing is left; each finished request's number of tokens."""
    counts: dict[str, int] = {}
    finished: dict[str, int] = {}
    while core.has_unfinished_requests():
        for out in core.step():
            counts[out.request_id] = counts.get(out.request_id, 0) + len(out.new_token_ids)
            if out.finished:
                finished[out.request_id] = counts[out.request_id]
    return finished


def test_what_cannot_run_with_steps_in_flight_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A KV connector plans its loads and saves step by step: refused at start with
    micro-batches asked for, naming the flag that turns them off; one step at a time takes
    it (and unset, they resolve off with it: tests/core/config/test_config.py)."""
    config = EngineConfig.from_kwargs(
        model=str(tmp_path), kv_transfer_config={"connector": "shared_storage",
                                                 "role": "producer", "path": str(tmp_path)},
        **MICRO_BATCHES)
    with pytest.raises(ConfigError, match="a KV connector .* does not run with pipeline "
                                          "micro-batches .*pass --no-enable-pipeline-micro-"
                                          "batching"):
        check_steps_in_flight_supported(config, 2)
    check_steps_in_flight_supported(config, 1)
