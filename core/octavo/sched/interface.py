"""``SchedulerInterface``: what the engine core asks of a scheduler.

A plugin replaces the scheduler by registering a subclass through
``octavo_register_schedulers`` and naming it with ``--scheduler-cls NAME``. The engine
builds it as ``cls(config, kv_manager, policy=..., kv_connector=..., structured_output=...)``
once the KV cache is sized (``config.cache.num_gpu_blocks`` and ``config.model.max_model_len``
are then set), and each step calls ``schedule()``, hands the output to the workers, then
``update_from_output()`` with what they return. Scheduler and workers share no state but
these plain-data messages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

from octavo.config import EngineConfig
from octavo.kv.interface import KVCacheManagerInterface
from octavo.kv_transfer.base import KVConnector
from octavo.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput, SchedulerStats
from octavo.request import Request, RequestStatus
from octavo.sched.policy import SchedulingPolicy

if TYPE_CHECKING:
    from octavo.sched.structured_outputs import StructuredOutputManager


class SchedulerInterface(ABC):
    # Whether it keeps a request out of the steps scheduled after one it is in until that
    # step's output is applied (``octavo.sched.scheduler``): the engine core keeps several
    # steps in flight (pipeline micro-batches) only with a scheduler that does.
    supports_steps_in_flight: bool = False
    # How many steps the engine core keeps in flight (set by it, when it supports them).
    steps_in_flight: int = 1

    @abstractmethod
    def __init__(self, config: EngineConfig, kv_manager: KVCacheManagerInterface, *,
                 policy: SchedulingPolicy | None = None,
                 kv_connector: KVConnector | None = None,
                 structured_output: StructuredOutputManager | None = None) -> None:
        ...

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request; raise ``ValueError`` naming the problem to refuse it."""

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Plan one step: which requests compute how many tokens, with their blocks."""

    @abstractmethod
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Take in a step's sampled tokens; return each affected request's news."""

    def forget_steps(self, scheduler_outputs: list[SchedulerOutput]) -> None:
        """Steps that failed: no output of theirs will come (their requests were aborted
        first). A scheduler that tracks steps in flight stops counting them; one that does
        not (``supports_steps_in_flight`` false) has nothing to do."""
        return None

    @abstractmethod
    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """End requests from outside (abort, a stop string); unknown ids are ignored."""

    @abstractmethod
    def has_unfinished_requests(self) -> bool:
        """Whether another step has work (or KV still being saved)."""

    @abstractmethod
    def reset_prefix_cache(self) -> None:
        """Forget every cached block no request holds."""

    @abstractmethod
    def make_stats(self) -> SchedulerStats:
        """A snapshot for logging and ``/metrics``."""
