"""``POST /v1/chat/completions``: the conversation through the model's chat template, then
generation as for completions; replies streamed as ``chat.completion.chunk`` deltas. A reply
forced to call tools comes back as ``tool_calls`` (see ``tool_calls``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from octavo.engine.errors import EngineDeadError, EngineStepError
from octavo.engine.outputs import CompletionOutput, RequestOutput
from octavo.entrypoints.openai.errors import OpenAIError, error_body, stream_error
from octavo.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobEntry,
    ChatLogprobs,
    ChatMessage,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    NamedToolChoice,
    TopLogprob,
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
from octavo.entrypoints.openai.tool_calls import new_call_id, parse_tool_calls, tool_call_constraint
from octavo.sampling_params import StructuredOutputsParams, check_text


class OpenAIServingChat(OpenAIServing):
    async def create(self, request: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(request.model)
        tools = [{"type": "function", "function": f.model_dump()} for f in request.forced_tools]
        prompt_ids = await self.engine.run_in_pool(apply_chat_template, self.engine.tokenizer,
                                                   request.messages, tools=tools or None)
        self.check_capacity()
        num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        max_tokens = request.max_completion_tokens or request.max_tokens
        params = self.sampling_params(request, max_tokens, num_logprobs,
                                      self._constraint(request))
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self.start(request_id, [{"prompt_token_ids": prompt_ids}], params,
                                   request.priority, request.cache_salt)
        if request.stream:
            return event_stream(self._stream(request_id, request, streams[0]))
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=499)  # nobody is listening
        choices = [self._choice(c, request) for c in outputs[0].outputs]
        body = ChatCompletionResponse(id=request_id, model=self.model_name, choices=choices,
                                      usage=usage_of(outputs))
        return JSONResponse(body.model_dump())

    async def _stream(self, request_id: str, request: ChatCompletionRequest,
                      stream: AsyncGenerator[RequestOutput, None]) -> AsyncIterator[str]:
        def chunk(choices: list[ChatStreamChoice]) -> str:
            return sse(ChatCompletionChunk(id=request_id, model=self.model_name,
                                           choices=choices))

        for index in range(request.n):  # OpenAI opens every choice with its role
            yield chunk([ChatStreamChoice(index=index,
                                          delta=DeltaMessage(role="assistant", content=""))])
        tracker = DeltaTracker(request.n)
        call_ids: dict[int, str] = {}  # choice index -> its call's id, once streamed
        final: RequestOutput | None = None
        try:
            async for _, output in merge_streams([stream]):
                final = output
                for delta in tracker.deltas(0, output, request.logprobs):
                    c = delta.completion
                    message = self._delta(request, delta.index, delta.text, c, call_ids)
                    if message is None:
                        continue
                    yield chunk([ChatStreamChoice(
                        index=delta.index, delta=message,
                        logprobs=self._logprobs(c, delta.first_new_token, request),
                        finish_reason=_finish_reason(request, c), stop_reason=c.stop_reason)])
        except (EngineDeadError, EngineStepError) as exc:
            error = stream_error(exc)
            yield sse(error_body(error.status, error.message, code=error.code))
        else:
            if request.include_usage and final is not None:
                yield sse(ChatCompletionChunk(id=request_id, model=self.model_name, choices=[],
                                              usage=usage_of([final])))
        yield SSE_DONE

    def _constraint(self, request: ChatCompletionRequest) -> StructuredOutputsParams | None:
        constraint = self.output_constraint(request)
        tool_calls = tool_call_constraint(request)
        if tool_calls is not None and constraint is not None:
            raise OpenAIError(400, "tool_choice forces a tool call, whose arguments follow the "
                                   "tool's schema: it cannot also follow response_format or "
                                   "guided_*", param="tool_choice")
        return tool_calls or constraint

    def _choice(self, completion: CompletionOutput, request: ChatCompletionRequest,
                ) -> ChatChoice:
        calls = None
        if request.forced_tools and completion.finish_reason == "stop":
            calls = parse_tool_calls(request, completion.text)
        message = (ChatResponseMessage(content=completion.text) if calls is None
                   else ChatResponseMessage(content=None, tool_calls=calls))
        return ChatChoice(index=completion.index, message=message,
                          logprobs=self._logprobs(completion, 0, request),
                          finish_reason=_finish_reason(request, completion),
                          stop_reason=completion.stop_reason)

    @staticmethod
    def _delta(request: ChatCompletionRequest, index: int, text: str,
               completion: CompletionOutput, call_ids: dict[int, str]) -> DeltaMessage | None:
        """What a chunk carries: content; or, for a named function, the arguments as they
        come (the first chunk names the call); or, for "required", every call once the
        reply is complete (None before that: its array is parsed whole)."""
        if not request.forced_tools:
            return DeltaMessage(content=text)
        if isinstance(request.tool_choice, NamedToolChoice):
            if index in call_ids:
                call = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text))
            else:
                call_ids[index] = new_call_id()
                call = DeltaToolCall(index=0, id=call_ids[index], type="function",
                                     function=DeltaFunctionCall(
                                         name=request.tool_choice.function.name,
                                         arguments=text))
            return DeltaMessage(tool_calls=[call])
        if not completion.finished():
            return None
        calls = parse_tool_calls(request, completion.text)
        if calls is None:
            return DeltaMessage(content=completion.text)
        return DeltaMessage(tool_calls=[
            DeltaToolCall(index=i, id=call.id, type="function",
                          function=DeltaFunctionCall(name=call.function.name,
                                                     arguments=call.function.arguments))
            for i, call in enumerate(calls)])

    @staticmethod
    def _logprobs(completion: CompletionOutput, first_token: int,
                  request: ChatCompletionRequest) -> ChatLogprobs | None:
        if not request.logprobs or completion.logprobs is None:
            return None
        return chat_logprobs(completion, first_token, request.top_logprobs or 0)


def _finish_reason(request: ChatCompletionRequest, completion: CompletionOutput) -> str | None:
    """OpenAI's "tool_calls" for a complete reply that calls tools."""
    if request.forced_tools and completion.finish_reason == "stop":
        return "tool_calls"
    return completion.finish_reason


def apply_chat_template(tokenizer: Any, messages: list[ChatMessage],
                        add_generation_prompt: bool = True,
                        tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The conversation as prompt token ids, by default ready for the assistant's reply
    (the same call as the offline ``LLM.chat``, so both give the model the same prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(400, "this model has no chat template; use /v1/completions",
                          param="messages")
    conversation = [m.template_dict() for m in messages]
    try:
        check_text("messages", json.dumps(conversation, ensure_ascii=False))
    except ValueError as exc:  # a lone surrogate: the tokenizer would raise a TypeError
        raise OpenAIError(400, str(exc), param="messages") from None
    try:
        ids = tokenizer.apply_chat_template(conversation,
                                            add_generation_prompt=add_generation_prompt,
                                            tokenize=True,
                                            return_dict=False, tools=tools)
    except (jinja2.TemplateError, ValueError) as exc:
        raise OpenAIError(400, f"messages: the chat template rejected them: {exc}",
                          param="messages") from None
    return list(ids)


def chat_logprobs(completion: CompletionOutput, first_token: int, num_top: int) -> ChatLogprobs:
    """Chat-style logprobs of ``completion``'s tokens from ``first_token`` on."""
    assert completion.logprobs is not None
    content = []
    for token, step in zip(completion.token_ids[first_token:], completion.logprobs[first_token:]):
        chosen = step[token]
        top = [_top_logprob(lp.decoded_token, lp.logprob) for _, lp in top_logprobs(step, num_top)]
        entry = _top_logprob(chosen.decoded_token, chosen.logprob)
        content.append(ChatLogprobEntry(**entry.model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)


def _top_logprob(text: str | None, logprob: float) -> TopLogprob:
    text = text or ""
    return TopLogprob(token=text, logprob=json_logprob(logprob),
                      bytes=list(text.encode("utf-8", errors="replace")))
