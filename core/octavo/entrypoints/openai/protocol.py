"""Request and response bodies of the OpenAI-compatible API (pydantic), in OpenAI's shapes.

Requests take OpenAI's fields plus vLLM's common sampling extensions (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``priority``, ``cache_salt``) and
guided decoding extensions (``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``). A sampling field the client leaves out takes the model's
generation_config.json default where it has one (``model_fields_set`` tells them apart).
Ranges are checked here, so an out-of-range value is a 400 that names the field. A field
this server does not implement (``best_of``, ``audio``, ...) is rejected rather than
silently ignored, unless it is null: some clients send every field, null when unused. The
OpenAPI document says so: ``additionalProperties: {"type": "null"}``. Types are strict, as
OpenAI's are and as the document says: ``"4"`` is not an integer, ``1`` or ``"yes"`` not a
boolean (pydantic's lax mode, and so vLLM, would take them).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from octavo.sampling_params import StructuredOutputsParams

MAX_LOGPROBS = 20  # as OpenAI and vLLM's default max_logprobs


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True,
                              json_schema_extra={"additionalProperties": {"type": "null"}})

    @model_validator(mode="after")
    def _reject_unsupported_fields(self) -> OpenAIRequest:
        unsupported = [k for k, v in (self.model_extra or {}).items() if v is not None]
        if unsupported:
            raise ValueError(f"unsupported field {unsupported[0]!r}: this server does not "
                             "implement it")
        return self


class StreamOptions(OpenAIRequest):
    include_usage: bool = False


class JsonSchemaFormat(OpenAIRequest):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")  # "schema" would shadow BaseModel's
    strict: bool | None = None


class ResponseFormat(OpenAIRequest):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with (and only with) type json_schema")
        return self


class SamplingRequest(OpenAIRequest):
    """The fields completions and chat completions share."""

    model: str | None = None  # None: the served model
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # torch.Generator's range
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    user: str | None = None  # an end-user id for the caller's records; not used here
    # Extensions (vLLM's names).
    top_k: int = Field(0, ge=-1)  # 0 or -1: off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    priority: int = 0  # lower is served first (with --scheduling-policy priority)
    # Only requests with the same salt share prefix-cache blocks (vLLM's extension).
    cache_salt: str | None = Field(None, min_length=1)
    # Guided decoding: OpenAI's response_format, or one of vLLM's guided_* extensions.
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def structured_outputs(self) -> StructuredOutputsParams | None:
        """The output constraint the request asks for, if any; ``ValueError`` when it asks
        for several or one is malformed (its schema, regex or grammar is checked later)."""
        given = {name: value for name, value in (
            ("guided_json", self.guided_json), ("guided_regex", self.guided_regex),
            ("guided_choice", self.guided_choice), ("guided_grammar", self.guided_grammar),
            ("response_format", self.response_format)) if value is not None}
        if self.response_format is not None and self.response_format.type == "text":
            del given["response_format"]
        if len(given) > 1:
            raise ValueError(f"give at most one output constraint, got {', '.join(given)}")
        if self.guided_json is not None:
            return StructuredOutputsParams(json=self.guided_json)
        if self.guided_regex is not None:
            return StructuredOutputsParams(regex=self.guided_regex)
        if self.guided_choice is not None:
            return StructuredOutputsParams(choice=self.guided_choice)
        if self.guided_grammar is not None:
            return StructuredOutputsParams(grammar=self.guided_grammar)
        if "response_format" not in given:
            return None
        assert self.response_format is not None
        if self.response_format.json_schema is not None:
            return StructuredOutputsParams(json=self.response_format.json_schema.json_schema)
        return StructuredOutputsParams(json_object=True)

    @model_validator(mode="after")
    def _check_sampling(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        for token, bias in (self.logit_bias or {}).items():
            if not token.lstrip("-").isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {token!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} "
                                 f"for token {token}")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingRequest):
    # One prompt (text or token ids) or a batch of them.
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default; None: the rest of the context
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # vLLM's extension (with --enable-prompt-embeds): one prompt, or a batch, given as
    # embeddings - each base64 of a safetensors file holding one [num_tokens, hidden_size]
    # tensor (see octavo.entrypoints.openai.prompt_embeds); prompt must then be "".
    prompt_embeds: str | list[str] | None = None


class TextPart(OpenAIRequest):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIRequest):
    # "developer" is OpenAI's newer name for "system".
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's reply: to which call

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template expects it."""
        if isinstance(self.content, list):
            content = "\n".join(part.text for part in self.content)
        else:
            content = self.content or ""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": content}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionDefinition(OpenAIRequest):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool | None = None


class ChatTool(OpenAIRequest):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(OpenAIRequest):
    name: str


class NamedToolChoice(OpenAIRequest):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # deprecated by OpenAI for the next one
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ChatTool] | None = None
    # "auto" (OpenAI's default with tools) would need a parser of free-form tool calls;
    # "required" and a named function constrain the output to the tools' schemas instead.
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # False: "required" makes exactly one call

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        choice = self.tool_choice
        if not self.tools:
            if choice is not None and choice != "none":
                raise ValueError("tool_choice needs tools")
            return self
        if choice is None or choice == "auto":
            raise ValueError('tool_choice "auto" is not supported: use "required", "none" '
                             "or a named function")
        names = [tool.function.name for tool in self.tools]
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names the function {choice.function.name!r}, "
                             f"which is not among the tools ({', '.join(names)})")
        return self

    @property
    def forced_tools(self) -> list[FunctionDefinition]:
        """The functions the reply must call one or more of (empty: a normal reply)."""
        if not self.tools or self.tool_choice == "none":
            return []
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            return [t.function for t in self.tools if t.function.name == name]
        return [t.function for t in self.tools]


class TokenizeRequest(OpenAIRequest):
    """vLLM's /tokenize: a ``prompt`` as is, or ``messages`` through the chat template."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool = True  # with ``prompt``
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True  # with ``messages``

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(OpenAIRequest):
    model: str | None = None
    tokens: list[int]


class ResetPrefixCacheRequest(OpenAIRequest):
    """No fields: the body is there so that the POST needs ``Content-Type: application/json``
    (see ``web_safety``); ``{}`` or no body at all."""


# Responses.


def _now() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's extension: the stop string or token id


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatLogprobEntry]


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "octavo"
    root: str  # the model file or folder served
    max_model_len: int
    # What the model is served for, vLLM's task names: ["generate"], or ["embed"] from the
    # pooling runner (--runner pooling).
    supported_tasks: list[str]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class EngineHealth(BaseModel):
    index: int  # the engine's data-parallel rank
    alive: bool
    pid: int | None  # None for an engine on another node
    num_requests_running: int
    num_requests_waiting: int


class HealthResponse(BaseModel):
    # "ok": every engine serves; "degraded": some data-parallel engines died, the others
    # serve (the answer is 503 when none is left).
    status: Literal["ok", "degraded"]
    engines: list[EngineHealth]


class VersionResponse(BaseModel):
    version: str
    platform: str
    engine_pid: int | None  # None while no engine core runs
    engine_running: bool


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: Any = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
