"""The plain data that crosses the engine's boundaries each step.

- scheduler -> workers: ``SchedulerOutput`` (``NewRequestData``, ``CachedRequestData``);
- workers -> scheduler: ``ModelRunnerOutput`` (``LogprobsLists``, ``KVConnectorOutput``);
- engine core -> front end: ``EngineCoreOutputs`` - one message a step: each request's
  ``EngineCoreOutput`` (with its ``EngineCoreEvent``s) and the ``SchedulerStats``;
- front end <-> engine core: ``UtilityCall`` and its ``UtilityResult``.

This is the one module of wire types; ``octavo.engine.serial`` frames and encodes them.

Ints, lists and numpy arrays only - no torch tensors - so a worker may be written in any
framework and live in another process, and everything here encodes with msgspec.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from octavo.lora_request import LoRAAdapterRef
from octavo.sampling_params import SamplingParams
from octavo.stats import KVTransferStats, PrefixCacheStats, SpecDecodingStats


@dataclass
class NewRequestData:
    """A request the workers have not seen yet (or see again after preemption)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]  # the block table (of KV group 0 when the model has several)
    num_computed_tokens: int
    # Output tokens already generated: non-empty when resuming after preemption.
    output_token_ids: list[int] = field(default_factory=list)
    # A model with several KV groups (sliding-window and full-attention layers): every
    # group's block table, group 0's (= ``block_ids``) first; empty with one group.
    group_block_ids: list[list[int]] = field(default_factory=list)
    # float32 [len(prompt_token_ids), hidden_size]: the prompt's embeddings, which the
    # model takes at the prompt positions instead of embedding the (placeholder) ids.
    prompt_embeds: np.ndarray | None = None
    # A model with SSM layers: the request's slot in their per-request state (-1: none).
    state_slot: int = -1
    lora: LoRAAdapterRef | None = None  # the LoRA adapter it runs with; None: the base model


@dataclass
class CachedRequestData:
    """Running requests the workers already hold, as parallel lists.

    Workers that sample keep each request's sampled tokens themselves; ``new_block_ids``
    are the blocks appended since the last step. ``new_token_ids`` are the output tokens
    among the positions scheduled this step (from ``max(num_computed_tokens, prompt
    length)`` on), for the workers that did not sample them (pipeline stages before the
    last); empty lists without pipeline parallelism. A request recomputing after preemption
    sends outputs the workers already hold from its ``NewRequestData`` again.

    With several KV groups, ``new_block_ids`` are group 0's and ``new_group_block_ids``
    holds, per request, every group's new blocks (group 0's first); it stays empty with
    one group.
    """

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)
    new_group_block_ids: list[list[list[int]]] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # req_id -> number of tokens to compute this step (prefill chunk, 1, or 1 + drafts).
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests that finished or were preempted since the last step: workers drop them.
    finished_req_ids: set[str] = field(default_factory=set)
    # req_id -> draft tokens to verify this step (speculative decoding).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # The KV connector's plain-data instructions for this step (loads, saves); None without one.
    kv_connector_metadata: Any = None
    # req_id -> blocks the request keeps after its rejected drafts' trailing blocks were
    # released since the last step: workers cut its block table to that many first.
    trimmed_block_tables: dict[str, int] = field(default_factory=dict)
    # Guided decoding: the constrained requests that sample this step, and one row of
    # allowed tokens each (int32 [len(ids), ceil(V / 32)]; see octavo.worker.grammar_bitmask).
    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: np.ndarray | None = None


@dataclass
class LogprobsLists:
    """Top-n logprobs of sampled positions; row ``i`` is one generated token.

    Column 0 is the sampled token itself, then the top-n tokens by logprob.
    """

    token_ids: np.ndarray  # int64 [num_tokens, n + 1]
    logprobs: np.ndarray  # float32 [num_tokens, n + 1]
    ranks: np.ndarray  # int64 [num_tokens]: rank of the sampled token (1 = most likely)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    # For each request in ``req_ids`` order: tokens sampled this step (empty while a
    # prompt is still being prefilled in chunks; several with speculative decoding).
    sampled_token_ids: list[list[int]]
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    # req_id -> prompt logprobs of the prompt positions computed this step.
    prompt_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    # The KV connector's report of this step; None without a connector.
    kv_connector_output: KVConnectorOutput | None = None
    # For each request in ``req_ids`` order: drafts proposed for the next step (speculative
    # decoding; empty when off).
    spec_token_ids: list[list[int]] = field(default_factory=list)
    # The pooling runner's: for each request in ``req_ids`` order, its pooled hidden state
    # (float32 [hidden_size]) once its whole prompt is computed, else None (vLLM's name).
    pooler_output: list[np.ndarray | None] = field(default_factory=list)


@dataclass
class KVConnectorOutput:
    """Transfers the worker side of a KV connector finished (request ids)."""

    finished_sending: set[str] = field(default_factory=set)  # KV saved: blocks may be freed
    finished_recving: set[str] = field(default_factory=set)  # load done (or failed)
    failed_recving: set[str] = field(default_factory=set)  # load failed: recompute the prompt


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


# The finish reason of a request whose step failed (vLLM's FinishReason.ERROR): the engine's
# fault, not the client's, unlike a refused request's "abort".
STEP_FAILED = "error"


@dataclass
class EngineCoreOutput:
    """One request's news from one step: new tokens, and whether and why it finished.

    Emitted for a request when it gets tokens, finishes, or gets prompt logprobs; events
    since its previous output ride along.
    """

    request_id: str
    new_token_ids: list[int]
    # "stop" | "length" | "abort" (a finished RequestStatus's value), or "error": a step it
    # was in failed.
    finish_reason: str | None = None
    stop_reason: int | None = None  # the stop token id, when a stop_token_ids entry finished it
    new_logprobs: LogprobsLists | None = None  # one row per new token
    new_prompt_logprobs: LogprobsLists | None = None  # the prompt positions computed this step
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    events: list[EngineCoreEvent] = field(default_factory=list)
    # The request's speculative-decoding acceptance, sent with its final output.
    spec_decoding: SpecDecodingStats | None = None
    # Why the engine ended the request: it refused it (it never ran; "abort", the client's
    # fault) or a step it was in failed ("error", the engine's). The client's request fails.
    error: str | None = None
    # A pooling request's pooled hidden state (float32 [hidden_size]), with its final
    # output (vLLM's name); None for generation.
    pooling_output: np.ndarray | None = None

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
    # Requests per LoRA adapter name, running and waiting (vLLM's lora stats); empty
    # without LoRA.
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def stopped(cls) -> SchedulerStats:
        """What a dead engine reports: nothing running or waiting, no KV cache held."""
        return cls(0, 0, 0.0, PrefixCacheStats())


@dataclass
class EngineCoreOutputs:
    """One message from the core: the outputs of one step (possibly none, when only the
    state changed, e.g. after an abort) and the scheduler's state after it."""

    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    engine_index: int = 0  # the sender's data-parallel rank
    # Requests the core had taken in when it made the stats: the front end's balancer counts
    # what it sent since as waiting there (the stats of a step do not show them yet).
    num_requests_received: int = 0


@dataclass
class UtilityCall:
    """Call ``EngineCore.<method>(*args)`` in the core process; answered by call id."""

    call_id: int
    method: str
    args: list[Any] = field(default_factory=list)


@dataclass
class UtilityResult:
    call_id: int
    result: Any = None
    error: str | None = None  # the exception's text when the call raised
