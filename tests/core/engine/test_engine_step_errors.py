"""A step that raises costs only its requests: a real engine core process, built with a
scheduler that fails on chosen requests (``failing_scheduler``, plugged in by its qualified
name), one request at a time (``max_num_seqs=1``), so a request that waits is not in the
failing step. The failing request gets an engine error (a 500, not a 400), the others run
as they would alone, the KV cache empties, and the engine serves on - until steps fail
``MAX_CONSECUTIVE_FAILED_STEPS`` times in a row, when the core exits as a broken engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from octavo import SamplingParams
from octavo.config import EngineConfig
from octavo.engine.async_llm import AsyncLLM
from octavo.engine.core_proc import MAX_CONSECUTIVE_FAILED_STEPS
from octavo.engine.errors import EngineDeadError, EngineStepError
from octavo.outputs import SchedulerStats
from octavo.testing.seeds import draw_seed
from tests.core.engine.failing_scheduler import FAIL_PLAN, FAIL_STEP, FailingScheduler
from tests.core.loop_engine import LoopEngine
from tests.core.tiny_models import save_tiny_model

ENGINE_ARGS = dict(dtype="float32", kv_cache_memory=8 * 2**20, max_num_seqs=1,
                   scheduler_cls=f"{FailingScheduler.__module__}.{FailingScheduler.__name__}")
PROMPT = {"prompt_token_ids": [2, 7, 1, 8, 2, 8]}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


class Served(LoopEngine):
    """The engine with the failing scheduler; every call gets 60 s."""

    def __init__(self, folder: Path) -> None:
        super().__init__(EngineConfig.from_kwargs(model=str(folder), **ENGINE_ARGS))

    def run(self, coroutine: Any) -> Any:
        return super().run(asyncio.wait_for(coroutine, 60))

    def tokens(self, request_id: str, params: SamplingParams = GREEDY) -> list[int]:
        return self.run(final_tokens(self.engine, request_id, params))  # type: ignore[no-any-return]

    def assert_idle(self) -> None:
        """Nothing left anywhere: the front end's tables, the scheduler, the KV cache."""

        async def idle() -> SchedulerStats:
            while (stats := self.stats.latest) is None or stats.num_running_reqs or \
                    stats.num_waiting_reqs:
                await asyncio.sleep(0.02)
            return stats

        stats = self.run(idle())
        assert stats.kv_cache_usage == 0.0, stats
        assert self.engine.num_unfinished_requests == 0
        self.engine.check_health()


async def final_tokens(engine: AsyncLLM, request_id: str,
                       params: SamplingParams = GREEDY) -> list[int]:
    outputs = [output async for output in engine.generate(PROMPT, params, request_id)]
    assert outputs[-1].finished
    return outputs[-1].outputs[0].token_ids


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, single_thread: None) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("tiny-llama-step-errors")
    save_tiny_model("llama", folder, seed=draw_seed())
    served = Served(folder)
    try:
        yield served
    finally:
        served.close()


def gather(served: Served, *request_ids: str, params: SamplingParams = GREEDY) -> list[Any]:
    """Send the requests in this order, at once; their tokens, or what they raised."""

    async def run() -> list[Any]:
        return await asyncio.gather(*(final_tokens(served.engine, request_id, params)
                                      for request_id in request_ids), return_exceptions=True)

    return served.run(run())  # type: ignore[no-any-return]


def assert_step_error(error: Any) -> None:
    assert isinstance(error, EngineStepError), repr(error)
    message = str(error)
    assert "PlantedFailure" in message and "Traceback" not in message, message


def test_a_failing_step_fails_its_request_alone(served: Served) -> None:
    alone = served.tokens("alone")
    failed, beside = gather(served, f"{FAIL_STEP}-1", "beside")
    assert_step_error(failed)
    assert beside == alone  # waiting while the step failed: it lost nothing
    served.assert_idle()
    assert served.tokens("after") == alone


def test_a_failed_plan_fails_every_request_it_held(served: Served) -> None:
    """A plan that fails half-made may have touched any request, so none is trusted."""
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    held, failed = gather(served, "held", f"{FAIL_PLAN}-1", params=long)
    assert_step_error(held)
    assert_step_error(failed)
    served.assert_idle()
    assert served.tokens("after-plan") == served.tokens("alone-again")


def test_steps_failing_in_a_row_end_the_engine(served: Served) -> None:
    """The earlier failures do not count: a step succeeded after each."""
    for attempt in range(MAX_CONSECUTIVE_FAILED_STEPS - 1):
        assert_step_error(gather(served, f"{FAIL_STEP}-in-a-row-{attempt}")[0])
    last = gather(served, f"{FAIL_STEP}-in-a-row-last")[0]
    assert isinstance(last, EngineDeadError), repr(last)
    served.engine.client.proc.join(10)
    assert served.engine.client.proc.exitcode == 1
    with pytest.raises(EngineDeadError):
        served.engine.check_health()
