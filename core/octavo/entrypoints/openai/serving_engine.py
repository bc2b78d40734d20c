"""What the completions and chat endpoints share: the model and capacity checks, the
mapping of request fields to ``SamplingParams``, running several engine requests as one
response, streaming deltas as server-sent events, and aborting on client disconnect."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from octavo.engine.async_llm import AsyncLLM
from octavo.engine.outputs import CompletionOutput, EmbeddingRequestOutput, Logprob, RequestOutput
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.admission import SequenceWindow, check_admission
from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.protocol import (
    PromptLogprob,
    PromptLogprobs,
    SamplingRequest,
    UsageInfo,
)
from octavo.entrypoints.openai.settings import ServerSettings
from octavo.entrypoints.openai.stall import check_not_stalled
from octavo.lora_request import LoRARequest
from octavo.pooling_params import PoolingParams
from octavo.sampling_params import SamplingParams, StructuredOutputsParams

T = TypeVar("T")
SSE_DONE = "data: [DONE]\n\n"
MIN_LOGPROB = -9999.0  # JSON has no -inf; vLLM reports masked tokens with this value
# Request fields a model's generation config may give defaults to (max_tokens aside).
DEFAULTABLE_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name

    def check_model(self, model: str | None) -> None:
        if (model is not None and model != self.model_name
                and model not in self.engine.served_loras):
            raise OpenAIError(404, f"The model {model!r} does not exist; this server serves "
                                   f"{self.model_name!r}", param="model",
                              code="model_not_found")

    def reply_model(self, model: str | None) -> str:
        """The ``model`` a reply names: the LoRA adapter's name where the request picked one
        (as vLLM does), else the served model's (a request's adapter cannot be unloaded
        while it runs, so every chunk of a stream names the same)."""
        return model if model is not None and model in self.engine.served_loras else (
            self.model_name)

    def lora_of(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter a request's ``model`` names (None: the base model)."""
        return None if model is None else self.engine.served_loras.get(model)

    @staticmethod
    def response_id(prefix: str, request: SamplingRequest) -> str:
        """``prefix`` and the client's ``request_id`` (vLLM's), else a fresh one."""
        return f"{prefix}{request.request_id or uuid.uuid4().hex}"

    def check_capacity(self, num_sequences: int) -> None:
        """503 at once when the engine is gone or too many sequences wait for it; 400 for a
        request of more sequences than may ever run (see admission.py)."""
        self.engine.check_health()
        check_not_stalled(self.engine, self.settings)
        check_admission(self.settings, num_sequences, self.engine.num_waiting_sequences)

    def sampling_params(self, request: SamplingRequest, max_tokens: int | None,
                        logprobs: int | None,
                        structured_outputs: StructuredOutputsParams | None = None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """The request's sampling params; a field it leaves out takes the model's
        generation-config default where there is one (vLLM's ``default_sampling_params``)."""
        defaults = self.engine.default_sampling_params
        given = request.model_fields_set
        if "max_tokens" in defaults and not given & {"max_tokens", "max_completion_tokens"}:
            max_tokens = None  # the Processor: the model's max_new_tokens, within the context
        sampling = {name: defaults[name] if name in defaults and name not in given
                    else getattr(request, name) for name in DEFAULTABLE_FIELDS}
        try:
            return SamplingParams(
                n=request.n, seed=request.seed,
                stop=[request.stop] if isinstance(request.stop, str) else request.stop or [],
                presence_penalty=request.presence_penalty,
                frequency_penalty=request.frequency_penalty, max_tokens=max_tokens,
                min_tokens=request.min_tokens, ignore_eos=request.ignore_eos,
                logprobs=logprobs, logit_bias=self._logit_bias(request.logit_bias),
                stop_token_ids=request.stop_token_ids or [],
                bad_words=request.bad_words or [],
                allowed_token_ids=request.allowed_token_ids,
                include_stop_str_in_output=request.include_stop_str_in_output,
                skip_special_tokens=request.skip_special_tokens,
                spaces_between_special_tokens=request.spaces_between_special_tokens,
                prompt_logprobs=(request.prompt_logprobs if request.prompt_logprobs is not None
                                 else prompt_logprobs),
                truncate_prompt_tokens=request.truncate_prompt_tokens,
                structured_outputs=structured_outputs, **sampling)
        except ValueError as exc:
            raise OpenAIError(400, str(exc)) from None

    @staticmethod
    def output_constraint(request: SamplingRequest) -> StructuredOutputsParams | None:
        """The request's response_format, structured_outputs or guided_* constraint (400
        when malformed; the engine's Processor then checks the schema, regex or grammar)."""
        try:
            return request.structured()
        except ValueError as exc:
            raise OpenAIError(400, str(exc)) from None

    def _logit_bias(self, logit_bias: dict[str, float] | None) -> dict[int, float] | None:
        if not logit_bias:
            return None
        vocab_size = self.engine.processor.vocab_size
        bias = {int(token): value for token, value in logit_bias.items()}
        outside = [token for token in bias if not 0 <= token < vocab_size]
        if outside:
            raise OpenAIError(400, f"logit_bias: token ids outside the vocabulary "
                                   f"[0, {vocab_size}): {outside[:5]}", param="logit_bias")
        return bias

    @overload
    async def start(self, request_id: str, prompts: list[PromptType], params: SamplingParams,
                    priority: int, cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None,
                    ) -> list[AsyncGenerator[RequestOutput, None]]: ...

    @overload
    async def start(self, request_id: str, prompts: list[PromptType], params: PoolingParams,
                    priority: int, cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None,
                    ) -> list[AsyncGenerator[EmbeddingRequestOutput, None]]: ...

    async def start(self, request_id: str, prompts: list[PromptType],
                    params: SamplingParams | PoolingParams, priority: int,
                    cache_salt: str | None = None, lora_request: LoRARequest | None = None,
                    ) -> list[AsyncGenerator[Any, None]]:
        """One engine request per prompt, processed one after another (a batch takes one
        processing thread at a time) and sent to the engine through a ``SequenceWindow``;
        a bad prompt fails the whole call (400) and aborts those of the batch already sent,
        as does cancelling the call. ``cache_salt`` goes with every prompt."""
        if cache_salt is not None:
            prompts = [salted(prompt, cache_salt) for prompt in prompts]
        ids = ([request_id] if len(prompts) == 1
               else [f"{request_id}-{index}" for index in range(len(prompts))])
        prepared = (await self.engine.prepare(prompt, params, engine_id, priority, lora_request)
                    for prompt, engine_id in zip(prompts, ids))
        per_prompt = params.n if isinstance(params, SamplingParams) else 1
        window = SequenceWindow(self.engine, self.settings.request_sequence_window, per_prompt)
        return await window.streams(prepared)

def salted(prompt: PromptType, cache_salt: str) -> PromptType:
    """The prompt as a dict carrying ``cache_salt`` (the Processor's prompt form)."""
    if isinstance(prompt, dict):
        return {**prompt, "cache_salt": cache_salt}
    key = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
    return {key: prompt, "cache_salt": cache_salt}


@dataclass
class ChoiceDelta:
    """What is new in one choice since the previous chunk of a stream."""

    index: int  # the choice's index in the response
    completion: CompletionOutput
    text: str
    first_new_token: int  # the new tokens are completion.token_ids[first_new_token:]


@dataclass
class DeltaTracker:
    """How much of each choice a stream has sent, so every chunk carries only what is new.
    Choice ``prompt_index * n + sequence index``, as OpenAI numbers batched prompts."""

    n: int
    sent_text: dict[int, int] = field(default_factory=dict)
    sent_tokens: dict[int, int] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)

    def deltas(self, prompt_index: int, output: RequestOutput,
               with_tokens: bool) -> Iterator[ChoiceDelta]:
        """The choices with something to send: new text, a finish, or (``with_tokens``,
        for logprobs) new tokens whose text is still held back."""
        for completion in output.outputs:
            index = prompt_index * self.n + completion.index
            if index in self.finished:
                continue
            text_start = self.sent_text.get(index, 0)
            token_start = self.sent_tokens.get(index, 0)
            text = completion.text[text_start:]
            new_tokens = len(completion.token_ids) > token_start
            if not (text or completion.finished() or (with_tokens and new_tokens)):
                continue
            self.sent_text[index] = len(completion.text)
            self.sent_tokens[index] = len(completion.token_ids)
            if completion.finished():
                self.finished.add(index)
            yield ChoiceDelta(index, completion, text, token_start)


def usage_of(outputs: list[RequestOutput]) -> UsageInfo:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion)


def top_logprobs(step: dict[int, Logprob], num: int) -> list[tuple[int, Logprob]]:
    """The ``num`` most likely tokens at one position, most likely first."""
    ranked = [(token, lp) for token, lp in step.items() if lp.rank is not None and lp.rank <= num]
    return sorted(ranked, key=lambda item: item[1].rank or 0)[:num]


def json_logprob(value: float) -> float:
    return max(value, MIN_LOGPROB)


def token_text(token_id: int, logprob: Logprob, as_ids: bool | None) -> str:
    """A token as logprobs show it: its text, or ``token_id:N`` (vLLM's
    ``return_tokens_as_token_ids``, for tokens whose text is not valid UTF-8 alone)."""
    return f"token_id:{token_id}" if as_ids else logprob.decoded_token or ""


def prompt_logprobs_json(output: RequestOutput) -> PromptLogprobs | None:
    """vLLM's ``prompt_logprobs``: per prompt position (None for the first), the prompt's
    token and the most likely ones, by token id."""
    if output.prompt_logprobs is None:
        return None
    return [None if step is None else
            {str(token): PromptLogprob(logprob=json_logprob(lp.logprob), rank=lp.rank,
                                       decoded_token=lp.decoded_token)
             for token, lp in step.items()}
            for step in output.prompt_logprobs]


async def merge_streams(streams: list[AsyncGenerator[T, None]],
                        ) -> AsyncGenerator[tuple[int, T], None]:
    """Items of several streams as they come, tagged with their stream's index. Every
    stream is closed when this one is, which aborts requests still running."""
    pending: dict[asyncio.Task[T], int] = {}
    try:
        pending = {asyncio.ensure_future(_next(s)): i for i, s in enumerate(streams)}
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                yield index, item
                pending[asyncio.ensure_future(_next(streams[index]))] = index
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


async def _next(stream: AsyncGenerator[T, None]) -> T:
    return await stream.__anext__()


async def final_outputs(streams: list[AsyncGenerator[T, None]]) -> list[T]:
    """The finished output of every stream, in stream order."""
    finals: dict[int, T] = {}
    async for index, output in merge_streams(streams):
        finals[index] = output
    return [finals[i] for i in range(len(streams))]


async def unless_disconnected(raw: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client disconnects first; ``work`` is then
    cancelled, which aborts its engine requests and frees their KV blocks."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def sse(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
