"""What the user gets back: ``RequestOutput`` and ``CompletionOutput`` for generation,
``EmbeddingRequestOutput`` and ``EmbeddingOutput`` for pooling (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.stats import SpecDecodingStats


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per generated token: token id -> its Logprob (the sampled token plus the top-n).
SampleLogprobs = list[dict[int, Logprob]]


@dataclass
class RequestMetrics:
    """``time.monotonic()`` timestamps of one request's life. ``arrival_time`` and the
    ``*_time`` fields are the front end's clock; ``queued_ts``, ``first_scheduled_time`` and
    ``first_token_ts`` are the engine core's events (its clock), so that durations between
    them (queue, prefill) never mix two machines' clocks."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    queued_ts: float | None = None  # the scheduler received it
    first_token_ts: float | None = None  # the core sampled its first token
    num_preemptions: int = 0
    # Speculative decoding: this request's drafts and acceptance (None when off).
    spec_decoding: SpecDecodingStats | None = None

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]  # truncated to the request's dimensions, normalised if asked


@dataclass
class EmbeddingRequestOutput:
    """A pooling request's result: one embedding for its prompt (``LLM.embed``)."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True
