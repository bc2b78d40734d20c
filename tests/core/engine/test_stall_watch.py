"""``StallWatch``: an engine with work and no report for longer than the timeout is stalled;
an idle one never is; a report ends it; a request sent to a silent idle engine starts the
clock (one engine only)."""

from __future__ import annotations

from octavo.engine.stall_watch import StallWatch
from octavo.outputs import SchedulerStats
from octavo.stats import PrefixCacheStats


def stats(running: int, waiting: int = 0) -> SchedulerStats:
    return SchedulerStats(running, waiting, 0.0, PrefixCacheStats())


def test_a_busy_silent_engine_is_stalled_until_it_reports() -> None:
    watch = StallWatch(2, timeout_s=2.0, now=0.0)
    watch.heard(0, stats(running=3), now=1.0)
    watch.heard(1, stats(running=0), now=1.0)  # idle: never stalled, however long
    assert watch.silences(now=3.0) == {}
    assert watch.silences(now=3.5) == {0: 2.5}
    watch.heard(0, None, now=3.6)  # outputs without stats: still busy, but heard
    assert watch.silences(now=4.0) == {}
    assert watch.silences(now=100.0) == {0: 96.4}


def test_a_request_to_an_idle_engine_starts_the_clock() -> None:
    watch = StallWatch(1, timeout_s=2.0, now=0.0)
    watch.heard(0, stats(running=0), now=1.0)
    watch.sent(now=50.0)
    watch.sent(now=51.0)  # the first unanswered request counts
    assert watch.silences(now=52.0) == {}
    assert watch.silences(now=52.5) == {0: 2.5}
    watch.heard(0, stats(running=1), now=53.0)
    assert watch.silences(now=54.0) == {}


def test_with_several_engines_only_their_stats_say_who_has_work() -> None:
    watch = StallWatch(2, timeout_s=2.0, now=0.0)
    watch.sent(now=1.0)  # which engine got it is the client's business
    assert watch.silences(now=10.0) == {}


def test_no_timeout_reports_nothing() -> None:
    watch = StallWatch(1, timeout_s=None, now=0.0)
    watch.heard(0, stats(running=1), now=0.0)
    assert watch.silences(now=1e6) == {}
