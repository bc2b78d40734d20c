"""``POST /v1/responses`` and ``GET /v1/responses/{id}``: OpenAI's Responses API over the
chat machinery. The input items (after the stored conversation of ``previous_response_id``,
and ``instructions`` as a system message) become a chat request; its reply becomes output
items - reasoning, a message, function calls.

Responses are stored (unless ``store: false``) so a later request can continue from them:
at most ``--max-stored-responses`` of them and ``MAX_STORE_BYTES`` of conversation, the
oldest forgotten first. The store lives in this process's memory: a restarted server has
forgotten them, as vLLM's has.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from octavo.engine.errors import EngineDeadError, EngineStepError
from octavo.engine.outputs import CompletionOutput, RequestOutput
from octavo.entrypoints.openai.chat_reply import Reply
from octavo.entrypoints.openai.errors import OpenAIError, stream_error
from octavo.entrypoints.openai.protocol import ChatCompletionRequest
from octavo.entrypoints.openai.responses_events import EventWriter
from octavo.entrypoints.openai.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    IncompleteDetails,
    MessageItem,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from octavo.entrypoints.openai.serving_chat import ChatJob, OpenAIServingChat
from octavo.entrypoints.openai.serving_engine import (
    event_stream,
    final_outputs,
    merge_streams,
    unless_disconnected,
)

MAX_STORE_BYTES = 64 * 1024 * 1024  # of stored conversations (their JSON), all together


@dataclass
class StoredResponse:
    body: dict[str, Any]  # what GET /v1/responses/{id} answers
    conversation: list[dict[str, Any]]  # chat messages, instructions excepted
    size: int  # bytes of JSON, for the store's budget


class ResponseStore:
    """Responses kept for ``previous_response_id``, newest last."""

    def __init__(self, max_count: int, max_bytes: int = MAX_STORE_BYTES) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def put(self, response_id: str, body: dict[str, Any],
            conversation: list[dict[str, Any]]) -> None:
        size = len(json.dumps([body, conversation]))
        if self.max_count == 0 or size > self.max_bytes:
            return
        self._items[response_id] = StoredResponse(body, conversation, size)
        self._bytes += size
        while len(self._items) > self.max_count or self._bytes > self.max_bytes:
            _, oldest = self._items.popitem(last=False)
            self._bytes -= oldest.size

    def get(self, response_id: str) -> StoredResponse:
        stored = self._items.get(response_id)
        if stored is None:
            raise OpenAIError(404, f"no stored response with id {response_id!r} (responses "
                                   "sent with store false, or forgotten to make room, are "
                                   "not kept)", param="previous_response_id",
                              code="response_not_found")
        return stored


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat
        self.store = ResponseStore(chat.settings.max_stored_responses)

    async def create(self, request: ResponsesRequest, raw: Request) -> Response:
        chat = self.chat
        chat.check_model(request.model)
        history = (self.store.get(request.previous_response_id).conversation
                   if request.previous_response_id else [])
        conversation = history + input_messages(request.input)
        job = await chat.begin(chat_request(request, conversation), "resp_")
        if request.stream:
            return event_stream(self._stream(request, job, conversation))
        outputs = await unless_disconnected(raw, final_outputs([job.outputs]))
        if outputs is None:
            return Response(status_code=499)  # nobody is listening
        completion = outputs[0].outputs[0]
        body = self._response(request, job.request_id, output_items(job.reader.reply(completion)),
                              completion, outputs[0])
        self._keep(request, body, conversation)
        return JSONResponse(body.model_dump())

    def retrieve(self, response_id: str) -> JSONResponse:
        stored = self.store.get(response_id)
        return JSONResponse(stored.body)

    async def _stream(self, request: ResponsesRequest, job: ChatJob,
                      conversation: list[dict[str, Any]]) -> AsyncIterator[str]:
        writer = EventWriter()
        started = self._response(request, job.request_id, [], None, None)
        yield writer.event("response.created", response=started.model_dump())
        yield writer.event("response.in_progress", response=started.model_dump())
        reply = job.reader.stream()
        final: RequestOutput | None = None
        try:
            async for _, output in merge_streams([job.outputs]):
                final = output
                delta = reply.delta(output.outputs[0])
                if delta is not None:
                    for event in writer.feed(delta):
                        yield event
        except (EngineDeadError, EngineStepError) as exc:
            error = stream_error(exc)
            yield writer.event("error", code=error.code, message=error.message, param=None)
            return
        for event in writer.close():
            yield event
        if final is None:
            return
        completion = final.outputs[0]
        body = self._response(request, job.request_id, writer.items, completion, final)
        self._keep(request, body, conversation)
        yield writer.event(f"response.{body.status}", response=body.model_dump())

    def _response(self, request: ResponsesRequest, response_id: str, items: list[OutputItem],
                  completion: CompletionOutput | None,
                  output: RequestOutput | None) -> ResponseObject:
        """The response object; without ``completion``, as it starts (in progress)."""
        status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
        incomplete = None
        if completion is not None:
            status = "incomplete" if completion.finish_reason == "length" else "completed"
            if status == "incomplete":
                incomplete = IncompleteDetails(reason="max_output_tokens")
        usage = None
        if output is not None and completion is not None:
            prompt, generated = len(output.prompt_token_ids), len(completion.token_ids)
            usage = ResponseUsage(input_tokens=prompt, output_tokens=generated,
                                  total_tokens=prompt + generated)
        tool_choice = request.tool_choice
        return ResponseObject(
            id=response_id, model=self.chat.reply_model(request.model), status=status,
            output=items,
            usage=usage, incomplete_details=incomplete, instructions=request.instructions,
            previous_response_id=request.previous_response_id,
            max_output_tokens=request.max_output_tokens, temperature=request.temperature,
            top_p=request.top_p, tools=[tool.model_dump() for tool in request.tools],
            tool_choice=(tool_choice.model_dump() if isinstance(tool_choice, FunctionToolChoice)
                         else tool_choice or ("auto" if request.tools else "none")),
            parallel_tool_calls=request.parallel_tool_calls,
            text=request.text.model_dump(by_alias=True, exclude_none=True) if request.text
            else {"format": {"type": "text"}},
            reasoning=request.reasoning.model_dump() if request.reasoning else None,
            metadata=request.metadata or {}, store=request.store, user=request.user)

    def _keep(self, request: ResponsesRequest, body: ResponseObject,
              conversation: list[dict[str, Any]]) -> None:
        if request.store:
            self.store.put(body.id, body.model_dump(),
                           conversation + reply_messages(body.output))


def input_messages(items: str | list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages: consecutive function calls become one assistant
    message's ``tool_calls``; reasoning items are dropped."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": item.text})
    return messages


def reply_messages(items: list[OutputItem]) -> list[dict[str, Any]]:
    """A response's output as the chat message(s) a next turn sees."""
    text = "".join(part.text for item in items if isinstance(item, OutputMessage)
                   for part in item.content)
    calls = [{"id": item.call_id, "type": "function",
              "function": {"name": item.name, "arguments": item.arguments}}
             for item in items if isinstance(item, OutputFunctionCall)]
    if not (text or calls):
        return []
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def output_items(reply: Reply) -> list[OutputItem]:
    items: list[OutputItem] = []
    if reply.reasoning:
        items.append(OutputReasoning(content=[ReasoningText(text=reply.reasoning)]))
    if reply.content:
        items.append(OutputMessage(content=[OutputText(text=reply.content)]))
    items.extend(OutputFunctionCall(call_id=call.id, name=call.function.name,
                                    arguments=call.function.arguments)
                 for call in reply.tool_calls)
    return items


def chat_request(request: ResponsesRequest,
                 conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that generates the response (400 when it is not a valid one)."""
    messages = ([{"role": "system", "content": request.instructions}]
                if request.instructions is not None else []) + conversation
    if not messages:
        raise OpenAIError(400, "input: give at least one item", param="input")
    body: dict[str, Any] = {
        "messages": messages, "max_completion_tokens": request.max_output_tokens,
        "model": request.model,  # a LoRA adapter's name picks it here too
        "parallel_tool_calls": request.parallel_tool_calls, "user": request.user,
        "priority": request.priority, "cache_salt": request.cache_salt,
        "request_id": request.request_id,
        **{name: getattr(request, name) for name in ("temperature", "top_p")
           if name in request.model_fields_set}}
    if request.tools:
        body["tools"] = [{"type": "function", "function": tool.model_dump(
            include={"name", "description", "parameters"}, exclude_none=True)}
            for tool in request.tools]
    choice = request.tool_choice
    if choice is not None:
        body["tool_choice"] = ({"type": "function", "function": {"name": choice.name}}
                               if isinstance(choice, FunctionToolChoice) else choice)
    if request.top_logprobs is not None:
        body.update(logprobs=True, top_logprobs=request.top_logprobs)
    text_format = request.text.format if request.text is not None else None
    if text_format is not None and text_format.type == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": text_format.name or "response", "schema": text_format.json_schema or {}}}
    elif text_format is not None and text_format.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise OpenAIError(400, f"input: {where}: {first.get('msg')}", param="input") from None
