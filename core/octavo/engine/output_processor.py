"""``OutputProcessor``: from the engine core's token ids to what the user sees.

Per request it detokenizes incrementally, applies stop strings (asking the core to abort
a request a stop string ended), converts logprobs, keeps timing metrics, and merges the
children of an ``n > 1`` request into one ``RequestOutput``. A pooling request's one
output carries the pooled vector instead: it becomes an ``EmbeddingRequestOutput``, cut to
the request's ``dimensions`` and L2-normalised when it asks (``embedding_of``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
)
from octavo.engine.stop_strings import StopStrings
from octavo.outputs import EngineCoreEventType, EngineCoreOutput, LogprobsLists
from octavo.pooling_params import PoolingParams
from octavo.request import Request

# F.normalize's floor on the norm (sentence-transformers' Normalize and vLLM use it).
NORM_EPS = 1e-12


@dataclass
class SequenceState:
    """One sample (one engine request) being turned into text."""

    index: int
    request: Request
    detokenizer: IncrementalDetokenizer | None
    output: CompletionOutput
    metrics: RequestMetrics
    num_cached_tokens: int = 0


@dataclass
class ParentState:
    """A user request: its prompt and its n sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[SequenceState] = field(default_factory=list)
    # vLLM's shape: None for the first prompt token (nothing precedes it), then one entry per
    # prompt token; filled as prefill chunks arrive.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @property
    def finished(self) -> bool:
        return all(s.output.finished() for s in self.sequences)

    def to_output(self) -> RequestOutput:
        first = self.sequences[0]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[s.output for s in self.sequences],
            finished=self.finished,
            prompt_logprobs=self.prompt_logprobs,
            num_cached_tokens=first.num_cached_tokens,
            metrics=first.metrics,
        )


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, ParentState] = {}
        self.sequences: dict[str, tuple[ParentState, SequenceState]] = {}

    def add_request(self, request_id: str, prompt: str | None, children: list[Request],
                    stops: StopStrings | None = None) -> None:
        """``stops``: the children's stop strings, compiled (``AsyncLLM`` does it on a
        processing thread: for many stop strings it takes milliseconds); built here if not."""
        parent = ParentState(request_id, prompt, children[0].prompt_token_ids)
        if stops is None:
            stops = StopStrings(children[0].sampling_params.stop)
        if children[0].sampling_params.prompt_logprobs is not None:
            parent.prompt_logprobs = [None]
        for index, child in enumerate(children):
            params = child.sampling_params
            # A prompt of embeddings has placeholder ids: no text context for the first token.
            context = [] if child.prompt_embeds is not None else child.prompt_token_ids
            detok = (IncrementalDetokenizer(self.tokenizer, context, params, stops)
                     if params.detokenize else None)
            state = SequenceState(index, child, detok,
                                  CompletionOutput(index=index,
                                                   logprobs=[] if params.logprobs is not None
                                                   else None),
                                  RequestMetrics(arrival_time=child.arrival_time))
            parent.sequences.append(state)
            self.sequences[child.request_id] = (parent, state)
        self.parents[request_id] = parent

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    def process_outputs(self, outputs: list[EngineCoreOutput],
                        ) -> tuple[list[RequestOutput | EmbeddingRequestOutput], list[str]]:
        """The updated user requests, and the engine request ids to abort (stop strings)."""
        updated: dict[str, ParentState] = {}
        results: list[RequestOutput | EmbeddingRequestOutput] = []
        to_abort: list[str] = []
        now = time.monotonic()
        for out in outputs:
            entry = self.sequences.get(out.request_id)
            if entry is None:
                continue  # aborted by the user meanwhile
            parent, seq = entry
            if out.pooling_output is not None:
                results.append(self._pooled(parent, seq.request, out.pooling_output))
                continue
            if out.new_prompt_logprobs is not None and seq.index == 0:
                assert parent.prompt_logprobs is not None
                parent.prompt_logprobs.extend(self._logprobs(out.new_prompt_logprobs))
            if self._apply(seq, out, now):
                to_abort.append(out.request_id)
            updated[parent.request_id] = parent
            if seq.output.finished():
                del self.sequences[out.request_id]
        for parent in updated.values():
            results.append(parent.to_output())
            if parent.finished:
                del self.parents[parent.request_id]
        return results, to_abort

    def _pooled(self, parent: ParentState, request: Request,
                vector: np.ndarray) -> EmbeddingRequestOutput:
        """A pooling request's final output; it is forgotten here."""
        del self.sequences[request.request_id]
        del self.parents[parent.request_id]
        assert request.pooling_params is not None, "a pooled output for a generation request"
        embedding = embedding_of(vector, request.pooling_params)
        return EmbeddingRequestOutput(parent.request_id, EmbeddingOutput(embedding.tolist()),
                                      parent.prompt_token_ids)

    def parent_of(self, engine_request_id: str) -> str | None:
        """The user request an engine request belongs to (None once it is gone)."""
        entry = self.sequences.get(engine_request_id)
        return None if entry is None else entry[0].request_id

    def abort_request(self, request_id: str) -> list[str]:
        """Forget a user request; returns its engine request ids for the core to abort."""
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return []
        ids = [s.request.request_id for s in parent.sequences]
        for engine_id in ids:
            self.sequences.pop(engine_id, None)
        return ids

    def _apply(self, seq: SequenceState, out: EngineCoreOutput, now: float) -> bool:
        """Fold one core output into ``seq``; True when a stop string ended it here."""
        self._record_events(seq.metrics, out, now)
        seq.num_cached_tokens = out.num_cached_tokens
        output = seq.output
        params = seq.request.sampling_params
        new_ids = out.new_token_ids
        output.token_ids.extend(new_ids)
        if out.new_logprobs is not None and output.logprobs is not None:
            output.logprobs.extend(self._logprobs(out.new_logprobs))
            output.cumulative_logprob = sum(
                step[tok].logprob for step, tok in zip(output.logprobs, output.token_ids))
        stop_string = None
        if seq.detokenizer is not None:
            # A stop token ends the text before itself unless asked to keep it.
            hide_last = (out.finish_reason == "stop" and out.stop_reason is not None
                         and not params.include_stop_str_in_output)
            for token_id in new_ids[:-1] if hide_last else new_ids:
                delta = seq.detokenizer.add_token(token_id)
                stop_string = seq.detokenizer.check_stop_strings(len(delta))
                if stop_string is not None:
                    break
            output.text = seq.detokenizer.output_text
        if stop_string is not None:
            output.finish_reason, output.stop_reason = "stop", stop_string
            seq.metrics.finished_time = now
            return not out.finished
        if out.finished:
            output.finish_reason, output.stop_reason = out.finish_reason, out.stop_reason
            seq.metrics.finished_time = now
        return False

    def _logprobs(self, lists: LogprobsLists) -> SampleLogprobs:
        result: SampleLogprobs = []
        for ids, values, rank in zip(lists.token_ids.tolist(), lists.logprobs.tolist(),
                                     lists.ranks.tolist()):
            step: dict[int, Logprob] = {}
            for column, (token_id, value) in enumerate(zip(ids, values)):
                if token_id in step:
                    continue
                step[token_id] = Logprob(value, rank if column == 0 else column,
                                         self.tokenizer.decode([token_id]))
            result.append(step)
        return result

    @staticmethod
    def _record_events(metrics: RequestMetrics, out: EngineCoreOutput, now: float) -> None:
        for event in out.events:
            if event.type == EngineCoreEventType.SCHEDULED and metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = event.timestamp
            elif event.type == EngineCoreEventType.QUEUED and metrics.queued_ts is None:
                metrics.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.FIRST_TOKEN and metrics.first_token_ts is None:
                metrics.first_token_ts = event.timestamp
            elif event.type == EngineCoreEventType.PREEMPTED:
                metrics.num_preemptions += 1
        if out.spec_decoding is not None:
            metrics.spec_decoding = out.spec_decoding
        if out.new_token_ids:
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now


def embedding_of(vector: np.ndarray, params: PoolingParams) -> np.ndarray:
    """The pooled ``vector`` as ``params`` ask: its first ``dimensions`` entries, then
    divided by its L2 norm when ``use_activation`` (vLLM truncates before normalising)."""
    vector = np.asarray(vector, dtype=np.float32)
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    if params.use_activation:
        vector = vector / max(float(np.linalg.norm(vector)), NORM_EPS)
    return vector
