"""The scheduler side of multi-LoRA: at most ``max_loras`` distinct adapters run at once.

A request whose adapter is not among the running ones starts only when a slot is free.
While one waits for a slot, no LoRA request behind it starts (requests for the base model
still do): the running adapters then drain, and the waiting adapter gets its slot instead
of being passed over for ever by a stream of requests for adapters already running.
The running set is capped, not just each step, so every step holds at most ``max_loras``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from octavo.request import Request


def running_adapters(running: Iterable[Request]) -> set[str]:
    """The digests of the adapters the running requests use."""
    return {request.lora.digest for request in running if request.lora is not None}


def admissible(waiting: Iterable[Request], running: Iterable[Request],
               max_loras: int) -> Iterator[Request]:
    """The waiting requests (in their order) that may start as far as adapters go."""
    active = running_adapters(running)
    blocked = False
    for request in waiting:
        if request.lora is None:
            yield request
        elif not blocked and (request.lora.digest in active or len(active) < max_loras):
            yield request
        else:
            blocked = True


def requests_per_adapter(requests: Iterable[Request]) -> dict[str, int]:
    """How many of ``requests`` run with each adapter, by its served name (the stats)."""
    return dict(Counter(request.lora.name for request in requests if request.lora is not None))
