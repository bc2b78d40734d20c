"""Bodies of ``/v1/responses``, OpenAI's Responses API, the subset vLLM serves: text in and
out (streamed as typed events), ``instructions``, function tools, structured output
(``text.format``), reasoning output, and ``previous_response_id`` for responses this server
stored.

Input items become chat messages (``to_chat_messages``), so a response is generated exactly
as a chat completion is: the same template, parsers and constraints. Fields asking for what
this server does not do (``background``, stored ``prompt`` templates, ``truncation: auto``,
``max_tool_calls``) are a 400 saying so; ``include``, ``metadata``, ``service_tier``,
``prompt_cache_key`` and ``safety_identifier`` are taken and change nothing here.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from octavo.entrypoints.openai.protocol import MAX_LOGPROBS, OpenAIRequest


class InputText(OpenAIRequest):
    type: Literal["input_text", "output_text", "text", "reasoning_text", "summary_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


def joined(content: str | list[InputText]) -> str:
    """Text given as a string or as parts."""
    return content if isinstance(content, str) else "".join(part.text for part in content)


class MessageItem(OpenAIRequest):
    type: Literal["message"] | None = None  # OpenAI's easy input form has no type
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return joined(self.content)


class FunctionCallItem(OpenAIRequest):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(OpenAIRequest):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return joined(self.output)


class ReasoningItem(OpenAIRequest):
    """An earlier reply's reasoning: accepted, and not shown to the model again (OpenAI's
    reasoning models drop it between turns too)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[InputText] = Field(default_factory=list)
    content: list[InputText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = FunctionCallItem | FunctionCallOutputItem | ReasoningItem | MessageItem


class FunctionTool(OpenAIRequest):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(OpenAIRequest):
    type: Literal["function"]
    name: str


class TextFormat(OpenAIRequest):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True,
                              json_schema_extra={"additionalProperties": {"type": "null"}})

    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")  # shadows BaseModel's
    strict: bool | None = None


class TextConfig(OpenAIRequest):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(OpenAIRequest):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(OpenAIRequest):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None  # a system message first; not carried to the next turn
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True  # False: not kept for a later previous_response_id
    stream: bool = False
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    user: str | None = None
    # Taken, and changing nothing here.
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    # Refused unless at their defaults.
    background: bool = False
    truncation: Literal["disabled", "auto"] | None = None
    max_tool_calls: int | None = None
    prompt: dict[str, Any] | None = None
    # vLLM's extensions.
    priority: int = 0
    cache_salt: str | None = Field(None, min_length=1)
    request_id: str | None = Field(None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _refuse(self) -> ResponsesRequest:
        for refused, why in ((self.background, "background responses are not supported"),
                             (self.truncation == "auto", 'truncation "auto" is not supported'),
                             (self.max_tool_calls is not None, "max_tool_calls is not "
                                                               "supported"),
                             (self.prompt is not None, "prompt templates are not supported")):
            if refused:
                raise ValueError(why)
        if isinstance(self.tool_choice, FunctionToolChoice) and self.tool_choice.name not in [
                tool.name for tool in self.tools]:
            raise ValueError(f"tool_choice names the function {self.tool_choice.name!r}, "
                             "which is not among the tools")
        return self


# Answers.


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText] = Field(default_factory=list)


class OutputReasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str = Field(default_factory=lambda: f"rs_{uuid.uuid4().hex}")
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str = Field(default_factory=lambda: f"fc_{uuid.uuid4().hex}")
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputReasoning | OutputMessage | OutputFunctionCall


class ResponseUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens: int = 0
    output_tokens_details: dict[str, int] = Field(
        default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int = 0


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    model: str
    status: Literal["in_progress", "completed", "incomplete", "failed"] = "completed"
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: dict[str, Any] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    store: bool = True
    truncation: Literal["disabled", "auto"] = "disabled"
    user: str | None = None


class ResponseEvent(BaseModel):
    """One server-sent event of a streamed response (OpenAI's ``response.*`` events): its
    ``type``, its place in the stream, and the fields of that type."""

    model_config = ConfigDict(extra="allow")

    type: str
    sequence_number: int
