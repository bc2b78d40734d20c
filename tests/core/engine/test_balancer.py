"""The data-parallel load balancer: vLLM's ``4 x waiting + running``, requests sent since an
engine's stats counted as waiting there, ties round-robin, dead engines skipped."""

from __future__ import annotations

import random

import pytest

from octavo.engine.balancer import LoadBalancer
from octavo.outputs import SchedulerStats
from octavo.stats import PrefixCacheStats


def stats(running: int, waiting: int) -> SchedulerStats:
    return SchedulerStats(running, waiting, 0.0, PrefixCacheStats())


def test_a_burst_between_updates_spreads_evenly() -> None:
    balancer = LoadBalancer(3)
    for _ in range(60):
        balancer.assign(balancer.pick(), 1)
    assert [load.sent for load in balancer.loads] == [20, 20, 20]


def test_stale_stats_count_what_was_sent_since_as_waiting() -> None:
    balancer = LoadBalancer(2)
    balancer.update(0, stats(running=0, waiting=0), received=0)
    balancer.update(1, stats(running=5, waiting=0), received=5)
    balancer.assign(1, 5)  # engine 1 holds its 5, all in its stats
    assert [balancer.pick(), balancer.assign(0, 1), balancer.pick()] == [0, None, 0]
    balancer.assign(0, 1)
    # Engine 0's stats still say 0 waiting, but 2 were sent since: 4 x 2 = 8 > 5.
    assert [load.score for load in balancer.loads] == [8, 5]
    assert balancer.pick() == 1
    balancer.update(0, stats(running=2, waiting=0), received=2)  # both now in its stats
    assert balancer.loads[0].score == 2


def test_the_weights_are_four_waiting_to_one_running() -> None:
    balancer = LoadBalancer(2)
    balancer.update(0, stats(running=7, waiting=0), received=0)
    balancer.update(1, stats(running=0, waiting=2), received=0)
    assert balancer.pick() == 0  # 7 < 8
    balancer.update(0, stats(running=9, waiting=0), received=0)
    assert balancer.pick() == 1  # 9 > 8


def test_dead_engines_get_nothing_and_none_alive_raises() -> None:
    balancer = LoadBalancer(3)
    balancer.mark_dead(1)
    seen = set()
    for _ in range(10):
        index = balancer.pick()
        balancer.assign(index, random.randint(1, 3))
        seen.add(index)
    assert seen == {0, 2}
    balancer.mark_dead(0)
    balancer.mark_dead(2)
    with pytest.raises(LookupError, match="no data-parallel engine is alive"):
        balancer.pick()
