"""``POST /v1/completions``: text completion of one prompt or a batch, streamed or not."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from octavo.engine.errors import EngineDeadError, EngineStepError
from octavo.engine.outputs import CompletionOutput, RequestOutput
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.errors import OpenAIError, error_body, stream_error
from octavo.entrypoints.openai.prompt_embeds import decode_prompt_embeds, encoded_prompt_embeds
from octavo.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from octavo.entrypoints.openai.serving_engine import (
    SSE_DONE,
    DeltaTracker,
    OpenAIServing,
    event_stream,
    final_outputs,
    json_logprob,
    merge_streams,
    sse,
    top_logprobs,
    unless_disconnected,
    usage_of,
)


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, request: CompletionRequest, raw: Request) -> Response:
        self.check_model(request.model)
        embeds = encoded_prompt_embeds(request.prompt, request.prompt_embeds,
                                       self.engine.processor.enable_prompt_embeds)
        prompts = prompt_list(request.prompt) if embeds is None else []
        self.check_capacity()
        params = self.sampling_params(request, request.max_tokens, request.logprobs,
                                      self.output_constraint(request))
        for encoded in embeds or []:  # decoded on a processing thread: it may be megabytes
            tensor = await self.engine.run_in_pool(decode_prompt_embeds, encoded)
            prompts.append({"prompt_embeds": tensor})
        request_id = f"cmpl-{uuid.uuid4().hex}"
        streams = await self.start(request_id, prompts, params, request.priority,
                                   request.cache_salt)
        if request.stream:
            return event_stream(self._stream(request_id, request, streams))
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=499)  # nobody is listening
        choices = [self._choice(prompt_index * request.n + c.index, c, c.text, 0, request)
                   for prompt_index, output in enumerate(outputs) for c in output.outputs]
        body = CompletionResponse(id=request_id, model=self.model_name, choices=choices,
                                  usage=usage_of(outputs))
        return JSONResponse(body.model_dump())

    async def _stream(self, request_id: str, request: CompletionRequest,
                      streams: list[AsyncGenerator[RequestOutput, None]],
                      ) -> AsyncIterator[str]:
        tracker = DeltaTracker(request.n)
        finals: dict[int, RequestOutput] = {}
        try:
            async for prompt_index, output in merge_streams(streams):
                finals[prompt_index] = output
                for delta in tracker.deltas(prompt_index, output, request.logprobs is not None):
                    choice = self._choice(delta.index, delta.completion, delta.text,
                                          delta.first_new_token, request)
                    yield sse(CompletionResponse(id=request_id, model=self.model_name,
                                                 choices=[choice]))
        except (EngineDeadError, EngineStepError) as exc:
            error = stream_error(exc)
            yield sse(error_body(error.status, error.message, code=error.code))
        else:
            if request.include_usage:
                usage = usage_of(list(finals.values()))
                yield sse(CompletionResponse(id=request_id, model=self.model_name, choices=[],
                                             usage=usage))
        yield SSE_DONE

    @staticmethod
    def _choice(index: int, completion: CompletionOutput, text: str, first_token: int,
                request: CompletionRequest) -> CompletionChoice:
        logprobs = None
        if request.logprobs is not None and completion.logprobs is not None:
            logprobs = completion_logprobs(completion, first_token, request.logprobs)
        return CompletionChoice(index=index, text=text, logprobs=logprobs,
                                finish_reason=completion.finish_reason,
                                stop_reason=completion.stop_reason)


def prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[PromptType]:
    """The ``prompt`` field as a list of engine prompts (text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise OpenAIError(400, "prompt: the prompt list is empty", param="prompt")
    if isinstance(prompt[0], int):
        return [{"prompt_token_ids": prompt}]
    return [p if isinstance(p, str) else {"prompt_token_ids": p} for p in prompt]


def completion_logprobs(completion: CompletionOutput, first_token: int,
                        num_top: int) -> CompletionLogprobs:
    """OpenAI's legacy logprobs of ``completion``'s tokens from ``first_token`` on: each
    token, its logprob, its offset in the text and the top ``num_top`` alternatives (plus
    the chosen token, as OpenAI does)."""
    result = CompletionLogprobs()
    assert completion.logprobs is not None
    offset = sum(len(step[token].decoded_token or "") for token, step in
                 zip(completion.token_ids[:first_token], completion.logprobs[:first_token]))
    for token, step in zip(completion.token_ids[first_token:],
                           completion.logprobs[first_token:]):
        chosen = step[token]
        text = chosen.decoded_token or ""
        result.tokens.append(text)
        result.token_logprobs.append(json_logprob(chosen.logprob))
        result.text_offset.append(offset)
        top: dict[str, float] = {}
        for _, lp in top_logprobs(step, num_top):  # most likely first: it keeps a shared text
            top.setdefault(lp.decoded_token or "", json_logprob(lp.logprob))
        top.setdefault(text, json_logprob(chosen.logprob))
        result.top_logprobs.append(top)
        offset += len(text)
    return result
