"""What the engine core reports per request and step: ``EngineCoreOutput``.

Plain data, like the worker boundary, so it can cross to the front-end process (the
``OutputProcessor`` detokenizes, applies stop strings and builds ``RequestOutput``s).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from octavo.kv.stats import PrefixCacheStats
from octavo.kv_transfer.stats import KVTransferStats
from octavo.sched.output import LogprobsLists
from octavo.spec.stats import SpecDecodingStats


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1  # the scheduler received the request
    SCHEDULED = 2  # first scheduled, or scheduled again after a preemption
    PREEMPTED = 3  # its blocks were taken back; it waits to be recomputed
    FIRST_TOKEN = 4  # its first output token was sampled


@dataclass
class EngineCoreEvent:
    """A timestamp (``time.monotonic()``, like ``Request.arrival_time``) of one event."""

    type: EngineCoreEventType
    timestamp: float

    @classmethod
    def now(cls, event_type: EngineCoreEventType) -> EngineCoreEvent:
        return cls(event_type, time.monotonic())


@dataclass
class EngineCoreOutput:
    """One request's news from one step: new tokens, and whether and why it finished.

    Emitted for a request when it gets tokens, finishes, or gets prompt logprobs; events
    since its previous output ride along.
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" (a finished RequestStatus's value)
    stop_reason: int | None = None  # the stop token id, when a stop_token_ids entry finished it
    new_logprobs: LogprobsLists | None = None  # one row per new token
    new_prompt_logprobs: LogprobsLists | None = None  # the prompt positions computed this step
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    events: list[EngineCoreEvent] = field(default_factory=list)
    # The request's speculative-decoding acceptance, sent with its final output.
    spec_decoding: SpecDecodingStats | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SchedulerStats:
    """A snapshot of the scheduler for logging and metrics."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float  # share of KV blocks held by requests
    prefix_cache: PrefixCacheStats
    kv_transfer: KVTransferStats = field(default_factory=KVTransferStats)
    spec_decoding: SpecDecodingStats | None = None  # totals since start; None: spec off
