"""An ``AsyncLLM`` for synchronous tests: started on an event loop of its own (one per module:
it is slow to start), with its engine core on one thread, as the test process runs, and a
record of the newest scheduler state it reported."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from octavo.config import EngineConfig
from octavo.engine.async_llm import AsyncLLM, IterationStats
from octavo.outputs import SchedulerStats


class StatsRecorder:
    def __init__(self) -> None:
        self.latest: SchedulerStats | None = None

    def record(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats,
               engine_index: int = 0) -> None:
        if scheduler_stats is not None:
            self.latest = scheduler_stats


def start_async_llm(loop: asyncio.AbstractEventLoop, config: EngineConfig,
                    **env: str) -> AsyncLLM:
    """``AsyncLLM.start(config)`` on ``loop``, the core process spawned with ``env`` set."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"OMP_NUM_THREADS": "1", **env}.items():
            patch.setenv(name, value)
        return loop.run_until_complete(AsyncLLM.start(config))


class LoopEngine:
    def __init__(self, config: EngineConfig, **env: str) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.engine = start_async_llm(self.loop, config, **env)
        except BaseException:
            self.loop.close()
            raise
        self.stats = StatsRecorder()
        self.engine.stat_loggers.append(self.stats)

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def close(self) -> None:
        self.engine.shutdown()
        self.loop.run_until_complete(asyncio.sleep(0))  # let the cancelled handler finish
        self.loop.close()
