"""``POST /v1/chat/completions``: the conversation through the chat template, then
generation as for completions; replies streamed as ``chat.completion.chunk`` deltas. How a
reply's text becomes reasoning, content and tool calls is ``chat_reply``'s job; which
constraint the request puts on it, ``tool_calls`` and ``reasoning_parsers``'."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from octavo.engine.errors import EngineDeadError, EngineStepError
from octavo.engine.outputs import CompletionOutput, RequestOutput
from octavo.entrypoints.openai.chat_reply import ReplyReader, ReplyStream
from octavo.entrypoints.openai.chat_template import (
    ChatRender,
    render,
    template_messages,
)
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
    ChatTemplateFields,
    ChatTool,
    DeltaMessage,
    TopLogprob,
)
from octavo.entrypoints.openai.reasoning_parsers import (
    Opening,
    ReasoningParser,
    get_reasoning_parser,
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
from octavo.entrypoints.openai.tool_calls import tool_call_constraint
from octavo.entrypoints.openai.tool_parsers import ToolParser, get_tool_parser
from octavo.sampling_params import StructuredOutputsParams


@dataclass
class ChatJob:
    """A chat request handed to the engine: its id, how to read its replies, its outputs."""

    request_id: str
    reader: ReplyReader
    outputs: AsyncGenerator[RequestOutput, None]


class OpenAIServingChat(OpenAIServing):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = self.settings
        self.tool_parser: ToolParser | None = (
            get_tool_parser(settings.tool_call_parser)
            if settings.enable_auto_tool_choice and settings.tool_call_parser else None)
        self.reasoning_parser: ReasoningParser | None = (
            get_reasoning_parser(settings.reasoning_parser) if settings.reasoning_parser
            else None)

    async def create(self, request: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(request.model)
        job = await self.begin(request, "chatcmpl-")
        if request.stream:
            return event_stream(self._stream(job, request))
        outputs = await unless_disconnected(raw, final_outputs([job.outputs]))
        if outputs is None:
            return Response(status_code=499)  # nobody is listening
        output = outputs[0]
        choices = [self._choice(c, request, job.reader) for c in output.outputs]
        ids = request.return_token_ids
        body = ChatCompletionResponse(id=job.request_id, model=self.reply_model(request.model),
                                      choices=choices,
                                      usage=usage_of(outputs),
                                      prompt_logprobs=prompt_logprobs_json(output),
                                      prompt_token_ids=output.prompt_token_ids if ids else None)
        return JSONResponse(body.model_dump())

    async def begin(self, request: ChatCompletionRequest, id_prefix: str) -> ChatJob:
        """Render the conversation and start generating (also for ``/v1/responses``)."""
        prompt, prompt_ids = await self.engine.run_in_pool(
            self.render_prompt, request.messages, request, request.tools,
            request.add_special_tokens, request.reasoning_effort)
        self.check_capacity(request.n)
        opening = (self.reasoning_parser.opening(prompt) if self.reasoning_parser is not None
                   else Opening.ANSWER)
        reader = ReplyReader(request, self.reasoning_parser, opening, self.tool_parser)
        num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        max_tokens = request.max_completion_tokens or request.max_tokens
        params = self.sampling_params(request, max_tokens, num_logprobs,
                                      self._constraint(request, reader))
        request_id = self.response_id(id_prefix, request)
        streams = await self.start(request_id, [{"prompt_token_ids": prompt_ids}], params,
                                   request.priority, request.cache_salt,
                                   self.lora_of(request.model))
        return ChatJob(request_id, reader, streams[0])

    def render_prompt(self, messages: list[ChatMessage], fields: ChatTemplateFields,
                      tools: list[ChatTool] | None, add_special_tokens: bool = False,
                      reasoning_effort: str | None = None) -> tuple[str, list[int]]:
        """The conversation as prompt text and token ids (on a processing thread)."""
        if fields.chat_template is not None and not self.settings.trust_request_chat_template:
            raise OpenAIError(400, "chat_template: this server takes no chat template from "
                                   "requests (start it with --trust-request-chat-template)",
                              param="chat_template")
        how = ChatRender(
            tools=[tool.model_dump(exclude_none=True) for tool in tools] if tools else None,
            documents=fields.documents, add_generation_prompt=fields.add_generation_prompt,
            continue_final_message=fields.continue_final_message,
            kwargs={**({"reasoning_effort": reasoning_effort} if reasoning_effort else {}),
                    **(fields.chat_template_kwargs or {})},
            template=fields.chat_template)
        tokenizer = self.engine.tokenizer
        text = render(tokenizer, self.settings.chat_template,
                      template_messages([m.template_dict() for m in messages]), how)
        ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return text, list(ids)

    def _constraint(self, request: ChatCompletionRequest,
                    reader: ReplyReader) -> StructuredOutputsParams | None:
        """The tools' or the output format's constraint, on the answer only (the reasoning
        before it stays free)."""
        constraint = self.output_constraint(request)
        tool_calls = tool_call_constraint(request, self.tool_parser)
        if tool_calls is not None and constraint is not None:
            raise OpenAIError(400, "tool_choice constrains the reply to the tools' calls: it "
                                   "cannot also follow response_format or guided_*",
                              param="tool_choice")
        constraint = tool_calls or constraint
        if constraint is None or reader.reasoning is None:
            return constraint
        return reader.reasoning.answer_only(constraint, reader.opening)

    async def _stream(self, job: ChatJob, request: ChatCompletionRequest,
                      ) -> AsyncIterator[str]:
        request_id, reader = job.request_id, job.reader

        def chunk(choices: list[ChatStreamChoice]) -> str:
            return sse(ChatCompletionChunk(id=request_id, model=self.reply_model(request.model),
                                           choices=choices))

        echo = _echoed(request)
        for index in range(request.n):  # OpenAI opens every choice with its role
            yield chunk([ChatStreamChoice(index=index, delta=DeltaMessage(
                role="assistant", content=echo or ""))])
        tracker = DeltaTracker(request.n)
        replies: dict[int, ReplyStream] = {}
        final: RequestOutput | None = None
        try:
            async for _, output in merge_streams([job.outputs]):
                final = output
                for delta in tracker.deltas(0, output, request.logprobs):
                    c = delta.completion
                    reply = replies.setdefault(delta.index, reader.stream())
                    message = reply.delta(c) or DeltaMessage()
                    logprobs = self._logprobs(c, delta.first_new_token, request)
                    finish = reader.finish_reason(c, reply.called) if c.finished() else None
                    if message == DeltaMessage() and finish is None and logprobs is None:
                        continue
                    token_ids = (c.token_ids[delta.first_new_token:]
                                 if request.return_token_ids else None)
                    yield chunk([ChatStreamChoice(index=delta.index, delta=message,
                                                  logprobs=logprobs, finish_reason=finish,
                                                  stop_reason=c.stop_reason,
                                                  token_ids=token_ids)])
        except (EngineDeadError, EngineStepError) as exc:
            error = stream_error(exc)
            yield sse(error_body(error.status, error.message, code=error.code))
        else:
            if request.include_usage and final is not None:
                yield sse(ChatCompletionChunk(id=request_id,
                                              model=self.reply_model(request.model),
                                              choices=[], usage=usage_of([final])))
        yield SSE_DONE

    def _choice(self, completion: CompletionOutput, request: ChatCompletionRequest,
                reader: ReplyReader) -> ChatChoice:
        reply = reader.reply(completion)
        content = reply.content
        echo = _echoed(request)
        if echo and not reply.tool_calls:
            content = echo + (content or "")
        message = ChatResponseMessage(content=content, reasoning=reply.reasoning,
                                      tool_calls=reply.tool_calls)
        return ChatChoice(index=completion.index, message=message,
                          logprobs=self._logprobs(completion, 0, request),
                          finish_reason=reader.finish_reason(completion,
                                                             bool(reply.tool_calls)),
                          stop_reason=completion.stop_reason,
                          token_ids=completion.token_ids if request.return_token_ids else None)

    @staticmethod
    def _logprobs(completion: CompletionOutput, first_token: int,
                  request: ChatCompletionRequest) -> ChatLogprobs | None:
        if not request.logprobs or completion.logprobs is None:
            return None
        return chat_logprobs(completion, first_token, request.top_logprobs or 0,
                             request.return_tokens_as_token_ids)


def _echoed(request: ChatCompletionRequest) -> str | None:
    """vLLM's ``echo``: the reply starts with the last message when it is the assistant's
    (the one a ``continue_final_message`` reply continues)."""
    last = request.messages[-1]
    return last.text if request.echo and last.role == "assistant" else None


def chat_logprobs(completion: CompletionOutput, first_token: int, num_top: int,
                  as_ids: bool | None = None) -> ChatLogprobs:
    """Chat-style logprobs of ``completion``'s tokens from ``first_token`` on."""
    assert completion.logprobs is not None
    content = []
    for token, step in zip(completion.token_ids[first_token:], completion.logprobs[first_token:]):
        top = [_top_logprob(token_text(top_id, lp, as_ids), lp.logprob)
               for top_id, lp in top_logprobs(step, num_top)]
        entry = _top_logprob(token_text(token, step[token], as_ids), step[token].logprob)
        content.append(ChatLogprobEntry(**entry.model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)


def _top_logprob(text: str, logprob: float) -> TopLogprob:
    return TopLogprob(token=text, logprob=json_logprob(logprob),
                      bytes=list(text.encode("utf-8", errors="replace")))
