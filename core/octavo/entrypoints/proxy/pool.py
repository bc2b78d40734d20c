"""``InstancePool``: the instances of one kind (prefill or decode), which are in rotation,
and the choice among them.

An instance that refuses a connection or answers 5xx leaves the rotation; a background probe
of its ``/health`` brings it back once it answers 200 again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

POLICIES = ("round_robin", "least_loaded")


@dataclass
class Instance:
    url: str
    healthy: bool = True
    in_flight: int = 0  # requests this proxy has sent it that are not done
    requests: int = 0
    failures: int = 0
    last_error: str | None = None
    down_since: float | None = None


class InstancePool:
    def __init__(self, kind: str, urls: list[str], policy: str) -> None:
        if not urls:
            raise ValueError(f"no {kind} instance given")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.kind = kind
        self.policy = policy
        self.instances = [Instance(url.rstrip("/")) for url in urls]
        self._next = 0

    def pick(self, exclude: frozenset[str] | set[str] = frozenset()) -> Instance | None:
        """An instance in rotation not in ``exclude`` (those this request already tried),
        or ``None``."""
        candidates = [i for i in self.instances if i.healthy and i.url not in exclude]
        if not candidates:
            return None
        if self.policy == "least_loaded":
            return min(candidates, key=lambda i: i.in_flight)
        self._next += 1
        return candidates[self._next % len(candidates)]

    def mark_down(self, instance: Instance, error: str) -> None:
        instance.failures += 1
        instance.last_error = error
        if instance.healthy:
            instance.healthy = False
            instance.down_since = time.time()
            logger.warning("%s instance %s is out of rotation: %s", self.kind, instance.url,
                           error)

    def mark_up(self, instance: Instance) -> None:
        if not instance.healthy:
            instance.healthy = True
            instance.down_since = None
            logger.info("%s instance %s is back in rotation", self.kind, instance.url)

    def status(self) -> list[dict[str, object]]:
        return [vars(instance).copy() for instance in self.instances]
