"""``POST /v1/completions``: text completion of one prompt or a batch, streamed or not.

With ``echo`` each choice's text (and logprobs) starts with its prompt's, as OpenAI's
legacy API and vLLM do; the prompt's logprobs then come from the engine's prompt logprobs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from octavo.engine.errors import EngineDeadError, EngineStepError
from octavo.engine.outputs import CompletionOutput, Logprob, RequestOutput
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
    prompt_logprobs_json,
    sse,
    token_text,
    top_logprobs,
    unless_disconnected,
    usage_of,
)


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, request: CompletionRequest, raw: Request) -> Response:
        self.check_model(request.model)
        embeds = encoded_prompt_embeds(request.prompt, request.prompt_embeds,
                                       self.engine.processor.enable_prompt_embeds)
        prompts = (prompt_list(request.prompt, request.add_special_tokens)
                   if embeds is None else [])
        self.check_capacity((len(prompts) + len(embeds or [])) * request.n)
        # echo shows the prompt's logprobs with the text's (vLLM does the same).
        params = self.sampling_params(request, request.max_tokens, request.logprobs,
                                      self.output_constraint(request),
                                      prompt_logprobs=request.logprobs if request.echo else None)
        for encoded in embeds or []:  # decoded on a processing thread: it may be megabytes
            tensor = await self.engine.run_in_pool(decode_prompt_embeds, encoded)
            prompts.append({"prompt_embeds": tensor})
        request_id = self.response_id("cmpl-", request)
        streams = await self.start(request_id, prompts, params, request.priority,
                                   request.cache_salt, self.lora_of(request.model))
        if request.stream:
            return event_stream(self._stream(request_id, request, streams))
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=499)  # nobody is listening
        choices = [self._choice(prompt_index * request.n + c.index, output, c, c.text, 0,
                                request)
                   for prompt_index, output in enumerate(outputs) for c in output.outputs]
        body = CompletionResponse(id=request_id, model=self.reply_model(request.model),
                                  choices=choices, usage=usage_of(outputs))
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
                    choice = self._choice(delta.index, output, delta.completion, delta.text,
                                          delta.first_new_token, request)
                    yield sse(CompletionResponse(id=request_id,
                                                 model=self.reply_model(request.model),
                                                 choices=[choice]))
        except (EngineDeadError, EngineStepError) as exc:
            error = stream_error(exc)
            yield sse(error_body(error.status, error.message, code=error.code))
        else:
            if request.include_usage:
                usage = usage_of(list(finals.values()))
                yield sse(CompletionResponse(id=request_id,
                                             model=self.reply_model(request.model),
                                             choices=[], usage=usage))
        yield SSE_DONE

    def _choice(self, index: int, output: RequestOutput, completion: CompletionOutput,
                text: str, first_token: int, request: CompletionRequest) -> CompletionChoice:
        """A choice, or the part of it from ``first_token`` on (a stream's delta): the
        first part of an echoed choice starts with its prompt."""
        logprobs = None
        if request.logprobs is not None and completion.logprobs is not None:
            logprobs = completion_logprobs(completion, first_token, request.logprobs,
                                           request.return_tokens_as_token_ids)
        if request.echo and first_token == 0:
            prompt = self._prompt_text(output)
            text = prompt + text
            if logprobs is not None:
                first = str(self.engine.tokenizer.decode(output.prompt_token_ids[:1]))
                logprobs = prompt_part(output, first, request.logprobs or 0,
                                       request.return_tokens_as_token_ids
                                       ).followed_by(logprobs, len(prompt))
        ids = request.return_token_ids
        return CompletionChoice(
            index=index, text=text, logprobs=logprobs, finish_reason=completion.finish_reason,
            stop_reason=completion.stop_reason,
            prompt_logprobs=prompt_logprobs_json(output) if first_token == 0 else None,
            prompt_token_ids=output.prompt_token_ids if ids and first_token == 0 else None,
            token_ids=completion.token_ids[first_token:] if ids else None)

    def _prompt_text(self, output: RequestOutput) -> str:
        if output.prompt is not None:
            return output.prompt
        return str(self.engine.tokenizer.decode(output.prompt_token_ids))


def prompt_list(prompt: str | list[str] | list[int] | list[list[int]],
                add_special_tokens: bool = True) -> list[PromptType]:
    """The ``prompt`` field as a list of engine prompts (text or token ids)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise OpenAIError(400, "prompt: the prompt list is empty", param="prompt")
    if isinstance(prompt[0], int):
        return [{"prompt_token_ids": prompt}]
    return [{"prompt": p, "add_special_tokens": add_special_tokens} if isinstance(p, str)
            else {"prompt_token_ids": p} for p in prompt]


def completion_logprobs(completion: CompletionOutput, first_token: int, num_top: int,
                        as_ids: bool | None = None) -> CompletionLogprobs:
    """OpenAI's legacy logprobs of ``completion``'s tokens from ``first_token`` on: each
    token, its logprob, its offset in the text and the top ``num_top`` alternatives (plus
    the chosen token, as OpenAI does)."""
    assert completion.logprobs is not None
    offset = sum(len(step[token].decoded_token or "") for token, step in
                 zip(completion.token_ids[:first_token], completion.logprobs[:first_token]))
    return legacy_logprobs(list(zip(completion.token_ids[first_token:],
                                    completion.logprobs[first_token:])),
                           num_top, as_ids, offset)


def prompt_part(output: RequestOutput, first_text: str, num_top: int,
                as_ids: bool | None) -> CompletionLogprobs:
    """An echoed prompt's legacy logprobs; its first token (``first_text``) has none, as in
    OpenAI's."""
    first = output.prompt_token_ids[0]
    head = CompletionLogprobs(text_offset=[0], token_logprobs=[None], top_logprobs=[None],
                              tokens=[f"token_id:{first}" if as_ids else first_text])
    steps = (output.prompt_logprobs or [])[1:]
    rest = legacy_logprobs(list(zip(output.prompt_token_ids[1:], steps)), num_top, as_ids, 0)
    return head.followed_by(rest, len(first_text))


def legacy_logprobs(steps: list[tuple[int, dict[int, Logprob] | None]], num_top: int,
                    as_ids: bool | None, offset: int) -> CompletionLogprobs:
    result = CompletionLogprobs()
    for token, step in steps:
        assert step is not None
        chosen = step[token]
        text = token_text(token, chosen, as_ids)
        result.tokens.append(text)
        result.token_logprobs.append(json_logprob(chosen.logprob))
        result.text_offset.append(offset)
        top: dict[str, float] = {}
        for top_id, lp in top_logprobs(step, num_top):  # most likely first: keeps a shared text
            top.setdefault(token_text(top_id, lp, as_ids), json_logprob(lp.logprob))
        top.setdefault(text, json_logprob(chosen.logprob))
        result.top_logprobs.append(top)
        offset += len(chosen.decoded_token or "")
    return result
