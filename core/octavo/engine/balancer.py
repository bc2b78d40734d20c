"""``LoadBalancer``: which data-parallel engine takes the next request (vLLM's rule).

Each engine's load is ``4 x waiting + running``: a waiting request will cost a prefill and
holds up the others' decode, a running one only a share of each step. The counts come from
the stats each engine publishes with its outputs, which lag: requests sent since the stats
were made are not in them. Each engine's stats say how many requests it had taken in, so
the balancer counts every request sent beyond that as waiting there - a burst arriving
between two updates spreads over the engines instead of all going to the one that looked
idle. Ties go round-robin.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.outputs import SchedulerStats

WAITING_WEIGHT = 4


@dataclass
class EngineLoad:
    waiting: int = 0  # as the engine's latest stats say
    running: int = 0
    received: int = 0  # requests the engine had taken in at those stats
    sent: int = 0  # requests sent to it, all told
    alive: bool = True

    @property
    def in_flight(self) -> int:
        """Sent, and not yet in the engine's stats."""
        return self.sent - self.received

    @property
    def score(self) -> int:
        return WAITING_WEIGHT * (self.waiting + self.in_flight) + self.running


class LoadBalancer:
    def __init__(self, num_engines: int) -> None:
        self.loads = [EngineLoad() for _ in range(num_engines)]
        self._next = 0  # where the search for a tie starts

    def pick(self) -> int:
        """The live engine with the lowest load; raises ``LookupError`` when none lives."""
        alive = [(load.score, (index - self._next) % len(self.loads), index)
                 for index, load in enumerate(self.loads) if load.alive]
        if not alive:
            raise LookupError("no data-parallel engine is alive")
        index = min(alive)[2]
        self._next = (index + 1) % len(self.loads)
        return index

    def assign(self, index: int, num_requests: int) -> None:
        self.loads[index].sent += num_requests

    def update(self, index: int, stats: SchedulerStats | None, received: int) -> None:
        """An engine's newest stats and how many requests it had taken in with them."""
        load = self.loads[index]
        if stats is not None:
            load.waiting, load.running = stats.num_waiting_reqs, stats.num_running_reqs
        load.received = received

    def mark_dead(self, index: int) -> None:
        self.loads[index].alive = False
