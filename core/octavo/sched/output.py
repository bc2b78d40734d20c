"""The worker boundary: what the scheduler sends to workers each step and what comes back.

Plain data only (ints, lists, numpy arrays) - no torch tensors - so a worker may be written
in any framework and may live in another process (these are msgspec/pickle friendly).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from octavo.sample.params import SamplingParams


@dataclass
class NewRequestData:
    """A request the workers have not seen yet (or see again after preemption)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    # Output tokens already generated: non-empty when resuming after preemption.
    output_token_ids: list[int] = field(default_factory=list)


@dataclass
class CachedRequestData:
    """Running requests the workers already hold, as parallel lists.

    Workers keep each request's sampled tokens themselves; ``new_block_ids`` are the
    blocks appended since the last step.
    """

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


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
    # allowed tokens each (int32 [len(ids), ceil(V / 32)]; see octavo.sample.bitmask).
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


@dataclass
class KVConnectorOutput:
    """Transfers the worker side of a KV connector finished (request ids)."""

    finished_sending: set[str] = field(default_factory=set)  # KV saved: blocks may be freed
    finished_recving: set[str] = field(default_factory=set)  # load done (or failed)
    failed_recving: set[str] = field(default_factory=set)  # load failed: recompute the prompt
