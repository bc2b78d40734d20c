"""``AsyncLLM``: the engine for the online server, with the core in its own process.

In this (the API) process: the ``Processor`` validates and tokenizes, the
``OutputProcessor`` detokenizes and applies stop strings, and one output-handler task
reads the core's outputs and hands each request the newest state of its output. Each
request is an async generator; leaving it early (a client that disconnected, a cancelled
task) aborts the request in the core, which frees its KV blocks.

Work whose time grows with what a client sent - tokenizing, chat templates, checking a
schema with xgrammar - runs on a few processing threads (``run_in_pool``), never on the
event loop: a multi-megabyte prompt or a deep schema would otherwise stall every client,
``/health`` included. The tokenizer and xgrammar release the GIL while they work (a chat
template is Python, which hands it over every few milliseconds). The threads share
the tokenizer, which is safe as long as no call changes its truncation or padding
settings: those are the only writes transformers makes to the Rust tokenizer, and one made
while another thread encodes raises "Already borrowed".

What a request sees is a snapshot, and the text in it is only what is safe to stream:
while a request runs, the last characters that could still become a stop string are held
back, so a stop string never reaches a client. A consumer slower than the engine skips
intermediate snapshots and gets the newest, so it never falls behind.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from octavo.config import EngineConfig
from octavo.engine.core_client import EngineClient, request_error
from octavo.engine.core_proc import EngineReady
from octavo.engine.errors import EngineDeadError, InvalidRequestError
from octavo.engine.launch import start_engine_client
from octavo.engine.lora_requests import lora_ref, lora_registry
from octavo.engine.output_processor import OutputProcessor, ParentState
from octavo.engine.outputs import CompletionOutput, EmbeddingRequestOutput, RequestOutput
from octavo.engine.processor import ProcessedPrompt, PromptType
from octavo.engine.stall_watch import StallWatch
from octavo.engine.stop_strings import StopStrings
from octavo.lora_request import LoRAAdapterRef, LoRARequest
from octavo.outputs import EngineCoreEventType, EngineCoreOutputs, SchedulerStats
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.pooling_params import PoolingParams
from octavo.request import Request
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
# Threads for request processing: enough that one slow prompt (a second for a few MB) does
# not hold up the rest, few enough to leave the cores to the engine.
PROCESSING_THREADS = 4


@dataclass
class FinishedRequestStats:
    """One finished user request (all its ``n`` samples), for vLLM's per-request
    histograms. Queue and prefill times are measured on the engine core's clock (its
    events), decode time on this process's, so no duration mixes two machines' clocks.
    A pooling request's phases are not measured (its output keeps no events): None."""

    finish_reasons: list[str]  # one per sample
    e2e_latency: float  # arrival to the last output, as a client sees it
    queued_time: float | None  # in the scheduler's waiting queue before first scheduled
    prefill_time: float | None  # first scheduled to first token
    decode_time: float | None  # first token to last token
    num_prompt_tokens: int
    num_generation_tokens: list[int]  # one per sample
    max_tokens_param: int | None

    @classmethod
    def pooled(cls, e2e_latency: float, num_prompt_tokens: int) -> FinishedRequestStats:
        """A pooling request: it stops (vLLM's reason) with its vector and no tokens."""
        return cls(finish_reasons=["stop"], e2e_latency=e2e_latency, queued_time=None,
                   prefill_time=None, decode_time=None, num_prompt_tokens=num_prompt_tokens,
                   num_generation_tokens=[0], max_tokens_param=None)

    @property
    def inference_time(self) -> float | None:
        """Time in the running batch: prefill and decode."""
        if self.prefill_time is None or self.decode_time is None:
            return None
        return self.prefill_time + self.decode_time

    @property
    def time_per_output_token(self) -> float | None:
        """Decode time over the tokens after the first (vLLM's per-request TPOT)."""
        longest = max(self.num_generation_tokens, default=0)
        if self.decode_time is None or longest <= 1:
            return None
        return self.decode_time / (longest - 1)


@dataclass
class IterationStats:
    """What one batch of core outputs did, as the API process saw it (its clock includes
    the trip from the core, as a client's would)."""

    num_prompt_tokens: int = 0  # prompts of the requests that got their first token
    num_generation_tokens: int = 0
    num_preempted_reqs: int = 0  # preemptions the core reported with these outputs
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


@dataclass
class PreparedRequest:
    """A request validated and tokenized, not yet sent to the core (``AsyncLLM.prepare``)."""

    request_id: str
    processed: ProcessedPrompt
    children: list[Request]  # one engine request per sample
    stops: StopStrings

    @property
    def num_sequences(self) -> int:
        return len(self.children)


class StatLogger(Protocol):
    """Told about every batch of core outputs (e.g. the Prometheus metrics)."""

    def record(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats,
               engine_index: int = 0) -> None:
        """``engine_index``: the data-parallel rank of the engine the stats are from."""


class _RequestState:
    """One user request in flight: the newest snapshot for its consumer, and its timing."""

    def __init__(self, arrival_time: float, max_tokens: int | None = None,
                 num_sequences: int = 1, lora: LoRAAdapterRef | None = None) -> None:
        self.arrival_time = arrival_time
        self.lora = lora  # its LoRA adapter (None: the base model)
        self.max_tokens = max_tokens  # the request's parameter, for the metrics
        self.num_tokens = 0  # output tokens over all n sequences, so far
        self.num_waiting_sequences = num_sequences  # of its n, those without a token yet
        self.last_token_time = arrival_time
        self._latest: RequestOutput | EmbeddingRequestOutput | Exception | None = None
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | EmbeddingRequestOutput | Exception | None) -> None:
        """The newest output, an error to raise, or None: the request was aborted."""
        self._latest = item
        self._ready.set()

    async def get(self) -> RequestOutput | EmbeddingRequestOutput | None:
        await self._ready.wait()
        self._ready.clear()
        item, self._latest = self._latest, None
        if isinstance(item, Exception):
            raise item
        return item

    def record(self, output: RequestOutput, now: float, stats: IterationStats) -> None:
        num_tokens = sum(len(c.token_ids) for c in output.outputs)
        self.num_waiting_sequences = sum(not c.token_ids for c in output.outputs)
        if num_tokens > self.num_tokens:
            if self.num_tokens == 0:
                stats.time_to_first_tokens.append(now - self.arrival_time)
                stats.num_prompt_tokens += len(output.prompt_token_ids)
            else:
                stats.inter_token_latencies.append(now - self.last_token_time)
            stats.num_generation_tokens += num_tokens - self.num_tokens
            self.num_tokens, self.last_token_time = num_tokens, now
        if output.finished:
            stats.finished_requests.append(self._finished(output, now))

    def _finished(self, output: RequestOutput, now: float) -> FinishedRequestStats:
        metrics = output.metrics
        queued = prefill = decode = 0.0
        if metrics is not None:
            if metrics.queued_ts is not None and metrics.first_scheduled_time is not None:
                queued = max(metrics.first_scheduled_time - metrics.queued_ts, 0.0)
            if metrics.first_token_ts is not None and metrics.first_scheduled_time is not None:
                prefill = max(metrics.first_token_ts - metrics.first_scheduled_time, 0.0)
            if metrics.first_token_time is not None and metrics.last_token_time is not None:
                decode = max(metrics.last_token_time - metrics.first_token_time, 0.0)
        return FinishedRequestStats(
            finish_reasons=[c.finish_reason or "abort" for c in output.outputs],
            e2e_latency=now - self.arrival_time, queued_time=queued, prefill_time=prefill,
            decode_time=decode, num_prompt_tokens=len(output.prompt_token_ids),
            num_generation_tokens=[len(c.token_ids) for c in output.outputs],
            max_tokens_param=self.max_tokens)


class AsyncLLM:
    def __init__(self, client: EngineClient, ready: EngineReady, config: EngineConfig,
                 data_parallel_secret: bytes | None = None) -> None:
        """Use ``await AsyncLLM.start(config)``."""
        self.client = client
        self.ready = ready
        self.config = config  # to start the engine core again, should it die
        self._secret = data_parallel_secret
        self.restarting = False
        self.tokenizer = ready.tokenizer
        from octavo.engine.llm_engine import build_processor  # the model stack: after spawning
        from octavo.models.generation_config import log_sampling_defaults

        self.processor = build_processor(ready.tokenizer, ready.hf_config, ready.max_model_len,
                                         config.model.enable_prompt_embeds,
                                         ready.generation_config, engine_platform(ready),
                                         ready.pooler)
        # The sampling defaults of requests that leave a field unset (vLLM's
        # get_diff_sampling_param): the model's generation config, unless "vllm".
        self.default_sampling_params = (log_sampling_defaults(ready.generation_config)
                                        if ready.generation_config is not None else {})
        self.lora_adapters = lora_registry(config, ready.hf_config)
        # The adapters the server serves, by the name ``model`` gives (octavo.entrypoints).
        self.served_loras: dict[str, LoRARequest] = {}
        self.output_processor = OutputProcessor(ready.tokenizer)
        self.stat_loggers: list[StatLogger] = []
        self._pool = ThreadPoolExecutor(PROCESSING_THREADS, thread_name_prefix="octavo-processor")
        self._states: dict[str, _RequestState] = {}
        # Each engine's newest scheduler state, by data-parallel rank (for /health).
        self.engine_stats: dict[int, SchedulerStats] = {}
        self._num_processing = 0  # sequences on the processing threads, not yet in _states
        self.stall_watch = StallWatch(config.parallel.data_parallel_size, None,
                                      time.monotonic())
        self._error: Exception | None = None
        self._handler = asyncio.get_running_loop().create_task(self._handle_outputs())

    @classmethod
    async def start(cls, config: EngineConfig,
                    data_parallel_secret: bytes | None = None) -> AsyncLLM:
        """Spawn the engine core process (one per data-parallel engine here) and wait until
        its model is loaded, and for the engines of headless nodes (the secret authenticates
        their handshakes); raises ``EngineStartError`` with the reason when it cannot start."""
        client, ready = await start_engine_client(config, data_parallel_secret)
        return cls(client, ready, config, data_parallel_secret)

    async def restart(self) -> None:
        """Replace a dead engine core with a new one (``--restart-engine``): requests of the
        old one have failed already; raises ``EngineStartError`` when the new one cannot
        start (the old one stays the current, dead one; ``check_health`` says it is being
        restarted until a restart succeeds)."""
        self.restarting = True
        client, ready = await start_engine_client(self.config, self._secret)
        self.restarting = False
        self._handler.cancel()
        self.client.shutdown()
        self._fail_all(EngineDeadError("the engine core was restarted"))
        self.output_processor = OutputProcessor(ready.tokenizer)
        self.client, self.ready, self._error = client, ready, None
        self.stall_watch = StallWatch(self.config.parallel.data_parallel_size,
                                      self.stall_watch.timeout_s, time.monotonic())
        self._handler = asyncio.get_running_loop().create_task(self._handle_outputs())

    def is_running(self) -> bool:
        """Whether the engine can serve requests (``check_health`` passes)."""
        return not self.client.dead and self._error is None

    @property
    def max_model_len(self) -> int:
        return self.ready.max_model_len

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` unless the engine can serve requests."""
        if self.restarting:
            raise EngineDeadError(f"the engine core is restarting (--restart-engine); "
                                  f"{self.client.death_message()}")
        self.client.check_alive()
        if self._error is not None:
            raise EngineDeadError(f"the engine's output handler failed: {self._error}")

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._states)

    def num_requests_with_lora(self, name: str) -> int:
        """Requests in flight that run with the LoRA adapter served as ``name``."""
        return sum(1 for state in self._states.values()
                   if state.lora is not None and state.lora.name == name)

    @property
    def num_waiting_sequences(self) -> int:
        """Sequences (each of a request's ``n``) accepted that have not produced a token yet
        (queued or prefilling): known here exactly and at once, unlike the core's count,
        which arrives a step late. Those of requests still being tokenized count too."""
        return self._num_processing + sum(state.num_waiting_sequences
                                          for state in self._states.values())

    async def run_in_pool(self, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``func(*args, **kwargs)`` on a processing thread, so the event loop keeps serving
        while it runs. Cancelling the call does not stop the thread: its result is dropped."""
        call = functools.partial(func, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    @property
    def supported_tasks(self) -> list[str]:
        """What the served model does, in vLLM's task names: ``generate``, or ``embed``
        (the pooling runner)."""
        return ["embed"] if self.ready.pooler is not None else ["generate"]

    @overload
    async def add_request(self, prompt: PromptType, sampling_params: SamplingParams,
                          request_id: str, priority: int = 0,
                          lora_request: LoRARequest | None = None,
                          ) -> AsyncGenerator[RequestOutput, None]: ...

    @overload
    async def add_request(self, prompt: PromptType, sampling_params: PoolingParams,
                          request_id: str, priority: int = 0,
                          lora_request: LoRARequest | None = None,
                          ) -> AsyncGenerator[EmbeddingRequestOutput, None]: ...

    async def add_request(self, prompt: PromptType,
                          sampling_params: SamplingParams | PoolingParams,
                          request_id: str, priority: int = 0,
                          lora_request: LoRARequest | None = None,
                          ) -> AsyncGenerator[Any, None]:
        """Validate and tokenize the request on a processing thread, send it to the core and
        return its outputs, to iterate as they grow (vLLM's ``add_request``). With
        ``PoolingParams`` (a pooling engine) the one output is an
        ``EmbeddingRequestOutput`` (see ``encode``).

        A bad request raises ``InvalidRequestError`` here, before anything runs (and before a
        streaming response has begun); from the return on it counts as waiting. Nothing of a
        request stays before the return - one that fails, or whose caller is cancelled while
        it is processed. Closing the iterator before the last output aborts the request.
        """
        return self.submit(await self.prepare(prompt, sampling_params, request_id, priority,
                                              lora_request))

    async def prepare(self, prompt: PromptType, sampling_params: SamplingParams | PoolingParams,
                      request_id: str, priority: int = 0,
                      lora_request: LoRARequest | None = None) -> PreparedRequest:
        """The first half of ``add_request``: validate and tokenize (raising
        ``InvalidRequestError``), without sending anything to the core, so that a caller
        with many prompts can check them all before any runs and send them as it likes."""
        self.check_health()
        num_sequences = (sampling_params.n if isinstance(sampling_params, SamplingParams)
                         else 1)
        self._num_processing += num_sequences  # waiting already: no burst slips past a cap
        try:
            processed, children, stops = await self.run_in_pool(
                self._process_request, prompt, sampling_params, request_id, priority,
                time.monotonic(), lora_request)
        finally:
            self._num_processing -= num_sequences
        return PreparedRequest(request_id, processed, children, stops)

    def submit(self, prepared: PreparedRequest) -> AsyncGenerator[Any, None]:
        """The second half of ``add_request``: send a prepared request to the core."""
        return self._register(prepared.request_id, prepared.processed, prepared.children,
                              prepared.stops)

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams,
                       request_id: str, priority: int = 0,
                       lora_request: LoRARequest | None = None,
                       ) -> AsyncGenerator[RequestOutput, None]:
        """vLLM's ``AsyncLLM.generate``: the request's output as it grows. A bad request
        raises at the first iteration; use ``add_request`` to hear of it before that."""
        outputs = await self.add_request(prompt, sampling_params, request_id, priority,
                                         lora_request)
        try:
            async for output in outputs:
                yield output
        finally:
            await outputs.aclose()

    async def encode(self, prompt: PromptType, pooling_params: PoolingParams,
                     request_id: str, priority: int = 0,
                     ) -> AsyncGenerator[EmbeddingRequestOutput, None]:
        """vLLM's ``AsyncLLM.encode``: a pooling request's one output, its embedding."""
        outputs = await self.add_request(prompt, pooling_params, request_id, priority)
        try:
            async for output in outputs:
                yield output
        finally:
            await outputs.aclose()

    def _process_request(self, prompt: PromptType,
                         sampling_params: SamplingParams | PoolingParams,
                         request_id: str, priority: int, arrival_time: float,
                         lora_request: LoRARequest | None = None,
                         ) -> tuple[ProcessedPrompt, list[Request], StopStrings]:
        """On a processing thread. The request arrived before it waited for one, so its
        latency counts that wait and this work (its stop strings' automaton too)."""
        lora = lora_ref(self.lora_adapters, lora_request)
        processed = self.processor.process_prompt(prompt)
        children = self.processor.make_requests(request_id, processed, sampling_params,
                                                priority, strict_length=True,
                                                arrival_time=arrival_time)
        for child in children:
            child.lora = lora
        return processed, children, StopStrings(children[0].sampling_params.stop)

    def _register(self, request_id: str, processed: ProcessedPrompt, children: list[Request],
                  stops: StopStrings) -> AsyncGenerator[Any, None]:
        """Track a processed request and send it to the core (on the event loop, which owns
        ``_states``); the engine may have died, or the id been taken, while it was processed."""
        self.check_health()
        if request_id in self._states:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        state = _RequestState(children[0].arrival_time, children[0].sampling_params.max_tokens,
                              len(children), children[0].lora)
        self.output_processor.add_request(request_id, processed.prompt, children, stops)
        self._states[request_id] = state
        self.stall_watch.sent(time.monotonic())
        try:
            self.client.add_requests(children)
        except Exception as exc:  # cannot be encoded for the core: nothing of it stays
            self.abort(request_id)
            raise InvalidRequestError(f"the request cannot be sent to the engine: "
                                      f"{type(exc).__name__}: {exc}") from None
        return self._outputs(request_id, state)

    def abort(self, request_id: str) -> None:
        """Stop a request; its consumer's iteration ends without a final output."""
        state = self._states.pop(request_id, None)
        if state is None:
            return
        state.put(None)
        self.client.abort_requests(self.output_processor.abort_request(request_id))

    async def reset_prefix_cache(self) -> None:
        """Forget the cached KV blocks of earlier prompts (a utility call to the core)."""
        self.check_health()
        await self.client.call_utility("reset_prefix_cache")

    def shutdown(self) -> None:
        """Stop the core process; requests still running end with ``EngineDeadError``."""
        self._handler.cancel()
        self.client.shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._fail_all(EngineDeadError("the engine was shut down"))

    async def _outputs(self, request_id: str, state: _RequestState,
                       ) -> AsyncGenerator[Any, None]:
        try:
            while (output := await state.get()) is not None:
                yield output
                if output.finished:
                    return
        finally:
            self.abort(request_id)  # a no-op once it finished

    async def _handle_outputs(self) -> None:
        try:
            while True:
                self._process(await self.client.get_output())
        except EngineDeadError as exc:
            self._fail_all(exc)
        except Exception as exc:  # a bug here must not leave every request hanging
            logger.exception("the output handler failed")
            self._error = exc
            self._fail_all(EngineDeadError(f"the engine's output handler failed: {exc}"))
        # A dead engine runs nothing and holds no KV cache: the metrics must say so at once.
        stopped = SchedulerStats.stopped()
        for stat_logger in self.stat_loggers:
            for engine_index in range(self.config.parallel.data_parallel_size):
                stat_logger.record(stopped, IterationStats(), engine_index)

    def _process(self, message: EngineCoreOutputs) -> None:
        now = time.monotonic()
        for refused in [out for out in message.outputs if out.error is not None]:
            self._fail_request(refused.request_id, request_error(refused))
        if message.scheduler_stats is not None:
            self.engine_stats[message.engine_index] = message.scheduler_stats
        self.stall_watch.heard(message.engine_index, message.scheduler_stats, now)
        stats = IterationStats(num_preempted_reqs=sum(
            event.type == EngineCoreEventType.PREEMPTED
            for out in message.outputs for event in out.events))
        outputs, to_abort = self.output_processor.process_outputs(message.outputs)
        for output in outputs:
            state = self._states.get(output.request_id)
            if state is None:
                continue
            if isinstance(output, EmbeddingRequestOutput):  # final, and no text to hold back
                stats.num_prompt_tokens += len(output.prompt_token_ids)
                stats.finished_requests.append(FinishedRequestStats.pooled(
                    now - state.arrival_time, len(output.prompt_token_ids)))
                state.put(output)
                del self._states[output.request_id]
                continue
            state.record(output, now, stats)
            parent = self.output_processor.parents.get(output.request_id)
            state.put(_streamable_snapshot(output, parent))
            if output.finished:
                del self._states[output.request_id]
        self.client.abort_requests(to_abort)  # ended by a stop string
        for stat_logger in self.stat_loggers:
            stat_logger.record(message.scheduler_stats, stats, message.engine_index)

    def _fail_request(self, engine_request_id: str, error: Exception) -> None:
        """The user request of a refused engine request fails with ``error``; its other
        samples (n > 1) are aborted."""
        parent = self.output_processor.parent_of(engine_request_id)
        if parent is None:
            return
        state = self._states.pop(parent, None)
        self.client.abort_requests(self.output_processor.abort_request(parent))
        if state is not None:
            state.put(error)

    def fail_running(self, error: Exception) -> None:
        """End every request in flight with ``error`` and abort it in its engine (the
        ``fail`` action on a stalled engine)."""
        for request_id in list(self._states):
            self._states.pop(request_id).put(error)
            self.client.abort_requests(self.output_processor.abort_request(request_id))

    def _fail_all(self, error: Exception) -> None:
        for state in self._states.values():
            state.put(error)
        self._states.clear()


def _streamable_snapshot(output: RequestOutput, parent: ParentState | None) -> RequestOutput:
    """A copy the output processor will not mutate further, with each running sequence's
    text cut to what its detokenizer says is safe to stream (``parent`` is None once the
    whole request finished: then all text is final)."""
    completions: list[CompletionOutput] = []
    for index, completion in enumerate(output.outputs):
        text = completion.text
        detokenizer = parent.sequences[index].detokenizer if parent is not None else None
        if detokenizer is not None:
            text = text[: detokenizer.streamable_text_len(completion.finished())]
        completions.append(replace(
            completion, text=text, token_ids=list(completion.token_ids),
            logprobs=None if completion.logprobs is None else list(completion.logprobs)))
    return replace(output, outputs=completions)


def engine_platform(ready: EngineReady) -> type[Platform] | None:
    """The platform class the engine core resolved, looked up in this process's registry so
    that the front end refuses what it cannot run (``Platform.validate_request``); None,
    with a warning, when this process lacks the platform's plugin (a headless node's)."""
    platforms = get_registries().platforms
    if ready.platform in platforms:
        return platforms.get(ready.platform)
    logger.warning("the engine runs on platform %r, whose plugin this process does not "
                   "have: requests it cannot run are refused by the engine core on arrival, "
                   "not here", ready.platform)
    return None
