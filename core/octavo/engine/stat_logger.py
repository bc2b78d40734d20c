"""``LoggingStatLogger``: a log line every few seconds while a server is busy - prompt and
generation throughput, running and waiting requests, KV-cache usage, prefix-cache hit rate
(vLLM's periodic "Avg prompt throughput" line). Off with ``--disable-log-stats``."""

from __future__ import annotations

import logging
import time

from octavo.engine.async_llm import IterationStats
from octavo.outputs import SchedulerStats

logger = logging.getLogger(__name__)


class LoggingStatLogger:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._since = time.monotonic()
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._latest: SchedulerStats | None = None

    def record(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats) -> None:
        self._prompt_tokens += iteration.num_prompt_tokens
        self._generation_tokens += iteration.num_generation_tokens
        if scheduler_stats is not None:
            self._latest = scheduler_stats
        now = time.monotonic()
        if now - self._since >= self.interval_s:
            self._log(now - self._since)
            self._since, self._prompt_tokens, self._generation_tokens = now, 0, 0

    def _log(self, elapsed_s: float) -> None:
        stats = self._latest
        if stats is None or not (self._prompt_tokens or self._generation_tokens
                                 or stats.num_running_reqs or stats.num_waiting_reqs):
            return  # idle: nothing worth a line
        logger.info("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
                    "tokens/s, Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, "
                    "Prefix cache hit rate: %.1f%%", self._prompt_tokens / elapsed_s,
                    self._generation_tokens / elapsed_s, stats.num_running_reqs,
                    stats.num_waiting_reqs, 100 * stats.kv_cache_usage,
                    100 * stats.prefix_cache.hit_rate)
