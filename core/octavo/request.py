"""``Request``: one generation request as the scheduler sees it, and its status.

Plain data: the scheduler, the KV manager and KV connectors read and advance it; the
workers never see it (they get ``NewRequestData`` / ``CachedRequestData``)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np

from octavo.lora_request import LoRAAdapterRef
from octavo.outputs import EngineCoreEvent
from octavo.pooling_params import PoolingParams
from octavo.sampling_params import SamplingParams
from octavo.stats import SpecDecodingStats


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"  # a KV connector is loading its prompt
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"  # its grammar is compiling; others go first
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")


@dataclass
class Request:
    """Tokens so far and how many of them have KV computed. ``num_tokens`` counts prompt
    plus output; the scheduler grants ``num_tokens - num_computed_tokens`` in chunks."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # lower is served first, as in vLLM
    eos_token_id: int | None = None
    cache_salt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Tokens that steps in flight will sample and the scheduler does not know yet (async
    # scheduling): their positions are scheduled, the worker fills in their ids.
    num_output_placeholders: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first schedule
    num_preemptions: int = 0
    # Prompt positions whose logprobs the front end has (a recompute after preemption
    # computes them again; see Scheduler._unsent_prompt_logprobs).
    num_prompt_logprobs_sent: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | None = None  # the stop_token_ids entry that finished the request
    # Chained hashes (``octavo.block_hash.BlockHash``) of the full blocks of known tokens,
    # extended as tokens arrive (``octavo.block_hash.update_block_hashes``).
    block_hashes: list[bytes] = field(default_factory=list, repr=False)
    # Timestamped events not yet reported in an EngineCoreOutput.
    events: list[EngineCoreEvent] = field(default_factory=list, repr=False)
    lora: LoRAAdapterRef | None = None  # the LoRA adapter computing this request; None: base
    # Speculative decoding: drafts proposed for the next step (not tokens until verified),
    # and this request's acceptance figures.
    spec_token_ids: list[int] = field(default_factory=list)
    spec_stats: SpecDecodingStats = field(default_factory=SpecDecodingStats, repr=False)
    # A prompt given as embeddings: float32 [num_prompt_tokens, hidden_size], the model's
    # input at the prompt positions; ``prompt_token_ids`` are then placeholders (zeros, as
    # in vLLM) that only give the prompt its length. Kept to recompute after preemption.
    prompt_embeds: np.ndarray | None = field(default=None, repr=False)
    # A pooling request (an engine run with runner=pooling takes no other): its prompt is
    # computed once and pooled into one vector; it generates nothing, so its
    # ``sampling_params`` are the defaults, never read.
    pooling_params: PoolingParams | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.finished
