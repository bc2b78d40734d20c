"""Scheduling policies: the order in which waiting requests are admitted and the order
in which running requests are preempted when KV blocks run out.

A policy gives each request a sort key; the scheduler admits the smallest key first and
preempts the largest first. Plugins add policies through
``octavo_register_scheduling_policies``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from octavo.request import Request


class SchedulingPolicy(ABC):
    """Contract: ``sort_key`` is a pure function of the request (the scheduler keeps the
    waiting queue sorted by it, so a key must not change while the request waits); the
    registered ``name`` is what ``--scheduling-policy`` takes; the class is built with no
    arguments, once per scheduler."""

    name: ClassVar[str]

    @abstractmethod
    def sort_key(self, request: Request) -> tuple[Any, ...]:
        """Smaller keys are served first and preempted last."""

    def order(self, requests: list[Request]) -> list[Request]:
        return sorted(requests, key=self.sort_key)

    def pick_victim(self, running: list[Request]) -> Request:
        """The running request to preempt: the one this policy values least."""
        return max(running, key=self.sort_key)


class FcfsPolicy(SchedulingPolicy):
    """First come, first served: by arrival time."""

    name = "fcfs"

    def sort_key(self, request: Request) -> tuple[Any, ...]:
        return (request.arrival_time, request.request_id)


class PriorityPolicy(SchedulingPolicy):
    """By ``priority`` (lower first, as in vLLM), then by arrival time."""

    name = "priority"

    def sort_key(self, request: Request) -> tuple[Any, ...]:
        return (request.priority, request.arrival_time, request.request_id)
