"""The periodic stats line of ``octavo serve`` (``--disable-log-stats`` turns it off)."""

from __future__ import annotations

import logging

import pytest

from octavo.config import EngineConfig
from octavo.engine.async_llm import IterationStats
from octavo.engine.stat_logger import LoggingStatLogger
from octavo.outputs import SchedulerStats
from octavo.stats import PrefixCacheStats


def stats(running: int, waiting: int) -> SchedulerStats:
    prefix = PrefixCacheStats()
    prefix.record(100, 25)
    return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting,
                          kv_cache_usage=0.5, prefix_cache=prefix)


def test_a_busy_interval_logs_one_line_and_an_idle_one_none(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("octavo.engine.stat_logger.time.monotonic", lambda: clock[0])
    stat_logger = LoggingStatLogger(interval_s=10.0)
    with caplog.at_level(logging.INFO, logger="octavo.engine.stat_logger"):
        clock[0] = 4.0
        stat_logger.record(stats(3, 1), IterationStats(num_prompt_tokens=200,
                                                       num_generation_tokens=40))
        assert not caplog.records  # within the interval
        clock[0] = 10.0
        stat_logger.record(stats(3, 1), IterationStats(num_generation_tokens=60))
        assert len(caplog.records) == 1
        line = caplog.records[0].getMessage()
        assert "Avg prompt throughput: 20.0 tokens/s" in line
        assert "Avg generation throughput: 10.0 tokens/s" in line
        assert "Running: 3 reqs, Waiting: 1 reqs, KV cache usage: 50.0%" in line
        assert "Prefix cache hit rate: 25.0%" in line
        clock[0] = 25.0
        stat_logger.record(stats(0, 0), IterationStats())
        assert len(caplog.records) == 1  # idle: nothing worth a line


def test_the_flag_and_its_interval_are_config_fields() -> None:
    config = EngineConfig.from_kwargs(disable_log_stats=True, log_stats_interval=2.5)
    assert config.observability.disable_log_stats
    assert config.observability.log_stats_interval == 2.5
    assert not EngineConfig().observability.disable_log_stats
