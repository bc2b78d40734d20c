"""``LoggingStatLogger``: a log line every few seconds while a server is busy - prompt and
generation throughput, running and waiting requests, KV-cache usage, prefix-cache hit rate
(vLLM's periodic "Avg prompt throughput" line), one line per engine when there are several
(data parallelism). Off with ``--disable-log-stats``."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from octavo.engine.async_llm import IterationStats
from octavo.outputs import SchedulerStats

logger = logging.getLogger(__name__)


@dataclass
class _EngineWindow:
    """One engine over the current interval."""

    stats: SchedulerStats | None = None  # its newest
    prompt_tokens: int = 0
    generation_tokens: int = 0

    @property
    def busy(self) -> bool:
        return bool(self.prompt_tokens or self.generation_tokens or (
            self.stats is not None and (self.stats.num_running_reqs
                                        or self.stats.num_waiting_reqs)))


class LoggingStatLogger:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._since = time.monotonic()
        self._engines: dict[int, _EngineWindow] = {}  # by data-parallel rank

    def record(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats,
               engine_index: int = 0) -> None:
        window = self._engines.setdefault(engine_index, _EngineWindow())
        window.prompt_tokens += iteration.num_prompt_tokens
        window.generation_tokens += iteration.num_generation_tokens
        if scheduler_stats is not None:
            window.stats = scheduler_stats
        now = time.monotonic()
        if now - self._since >= self.interval_s:
            self._log(now - self._since)
            self._since = now
            for window in self._engines.values():
                window.prompt_tokens = window.generation_tokens = 0

    def _log(self, elapsed_s: float) -> None:
        if not any(window.busy for window in self._engines.values()):
            return  # idle: nothing worth a line
        for index, window in sorted(self._engines.items()):
            if window.stats is None:
                continue
            stats = window.stats
            prefix = f"Engine {index:03d}: " if len(self._engines) > 1 else ""
            logger.info("%sAvg prompt throughput: %.1f tokens/s, Avg generation throughput: "
                        "%.1f tokens/s, Running: %d reqs, Waiting: %d reqs, KV cache usage: "
                        "%.1f%%, Prefix cache hit rate: %.1f%%", prefix,
                        window.prompt_tokens / elapsed_s, window.generation_tokens / elapsed_s,
                        stats.num_running_reqs, stats.num_waiting_reqs,
                        100 * stats.kv_cache_usage, 100 * stats.prefix_cache.hit_rate)
