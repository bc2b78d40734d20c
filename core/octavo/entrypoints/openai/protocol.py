"""Request and response bodies of the OpenAI-compatible API (pydantic), in OpenAI's shapes.

Requests take OpenAI's fields plus vLLM's extensions, with vLLM's names and meaning: the
sampling ones (``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids``, ``bad_words``,
``allowed_token_ids``, ``prompt_logprobs``, ``echo``, ``truncate_prompt_tokens``, ...), guided
decoding (``structured_outputs`` and the older ``guided_*``), and the chat template's
(``chat_template_kwargs``, ``continue_final_message``, ``documents``, ...). A sampling field
the client leaves out takes the model's generation_config.json default where it has one
(``model_fields_set`` tells them apart). Ranges are checked here, so an out-of-range value is
a 400 that names the field.

Every field vLLM accepts is known here. The few that ask for what this server does not do
(beam search, ``best_of`` other than ``n``, custom logits processors, multimodal inputs) are
a 400 saying so when set to anything but their default (``VLLM_REFUSED``), as vLLM V1 refuses
``best_of``. Any other field is rejected rather than silently ignored, unless it is null:
some clients send every field, null when unused (vLLM, by contrast, ignores unknown fields
with a warning). The OpenAPI document says so: ``additionalProperties: {"type": "null"}``.
Types are strict, as OpenAI's are and as the document says: ``"4"`` is not an integer, ``1``
or ``"yes"`` not a boolean (pydantic's lax mode, and so vLLM, would take them).
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


class StructuralTagItem(OpenAIRequest):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    begin: str
    structural_tag_schema: dict[str, Any] | bool = Field(True, alias="schema")
    end: str


class ResponseFormat(OpenAIRequest):
    # "structural_tag" is vLLM's: text with JSON parts between begin and end strings.
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[StructuralTagItem] | None = None
    triggers: list[str] | None = None
    format: dict[str, Any] | None = None  # xgrammar's newer structural-tag form

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with (and only with) type json_schema")
        tagged = self.format is not None or self.structures is not None
        if (self.type == "structural_tag") != tagged:
            raise ValueError("structures and triggers (or format) are required with (and "
                             "only with) type structural_tag")
        return self

    def params(self) -> StructuredOutputsParams:
        """The constraint of a format other than "text"."""
        if self.json_schema is not None:
            return StructuredOutputsParams(json=self.json_schema.json_schema)
        if self.type == "structural_tag":
            tag: dict[str, Any] = {"type": "structural_tag"}
            if self.format is not None:
                tag["format"] = self.format
            else:
                tag["structures"] = [item.model_dump(by_alias=True)
                                     for item in self.structures or []]
                tag["triggers"] = self.triggers or []
            return StructuredOutputsParams(structural_tag=tag)
        return StructuredOutputsParams(json_object=True)


class StructuredOutputsRequest(OpenAIRequest):
    """vLLM's ``structured_outputs``: one constraint on the output."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True,
                              json_schema_extra={"additionalProperties": {"type": "null"}})

    json_schema: str | dict[str, Any] | None = Field(None, alias="json")  # shadows BaseModel's
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    # vLLM's switches for its other backends: accepted at their defaults (xgrammar's JSON
    # here is always compact, with no additional properties beyond the schema's own).
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def params(self) -> StructuredOutputsParams:
        if self.whitespace_pattern is not None:
            raise ValueError("structured_outputs.whitespace_pattern is not supported: JSON is "
                             "generated compact")
        return StructuredOutputsParams(json=self.json_schema, regex=self.regex,
                                       choice=self.choice, grammar=self.grammar,
                                       json_object=bool(self.json_object),
                                       structural_tag=self.structural_tag)


# vLLM fields asking for what this server does not do: (field, the values that ask for
# nothing, why). Anything else is a 400 naming the field.
VLLM_REFUSED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("use_beam_search", (False,), "beam search is not supported"),
    ("length_penalty", (1.0,), "length_penalty applies to beam search, which is not supported"),
    ("logits_processors", (None, []), "custom logits processors are not supported"),
    ("guided_decoding_backend", (None, "xgrammar", "auto"),
     "the only guided decoding backend is xgrammar"),
    ("guided_whitespace_pattern", (None,), "JSON is generated compact"),
    ("kv_transfer_params", (None, {}), "KV transfer parameters come from --kv-transfer-config"),
    ("vllm_xargs", (None, {}), "no extension reads vllm_xargs"),
    ("mm_processor_kwargs", (None, {}), "multimodal inputs are not supported"),
    ("media_io_kwargs", (None, {}), "multimodal inputs are not supported"),
    ("max_repetition_pattern_size", (0,), "stopping on repeated patterns is not supported"),
    ("min_repetition_pattern_size", (0,), "stopping on repeated patterns is not supported"),
    ("repetition_min_count", (0,), "stopping on repeated patterns is not supported"),
)


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
    # vLLM's sampling extensions.
    top_k: int = Field(0, ge=-1)  # 0 or -1: off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None  # never generated (each word, alone or after a space)
    allowed_token_ids: list[int] | None = Field(None, min_length=1)  # only these are generated
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)  # keep the last k (-1: all that fit)
    echo: bool = False
    best_of: int | None = Field(None, ge=1)  # vLLM V1: only as many as n
    priority: int = 0  # lower is served first (with --scheduling-policy priority)
    # Only requests with the same salt share prefix-cache blocks (vLLM's extension).
    cache_salt: str | None = Field(None, min_length=1)
    request_id: str | None = Field(None, min_length=1, max_length=128)  # names the response
    return_tokens_as_token_ids: bool | None = None  # logprobs' tokens as "token_id:N"
    return_token_ids: bool | None = None  # the prompt's and each choice's token ids
    # Guided decoding: OpenAI's response_format, vLLM's structured_outputs, or one of the
    # older guided_* fields.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's fields for what this server does not do (see VLLM_REFUSED).
    use_beam_search: bool = False
    length_penalty: float = 1.0
    logits_processors: list[Any] | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None
    max_repetition_pattern_size: int = 0
    min_repetition_pattern_size: int = 0
    repetition_min_count: int = 0

    def structured(self) -> StructuredOutputsParams | None:
        """The output constraint the request asks for, if any; ``ValueError`` when it asks
        for several or one is malformed (its schema, regex or grammar is checked later)."""
        given = {name: value for name, value in (
            ("guided_json", self.guided_json), ("guided_regex", self.guided_regex),
            ("guided_choice", self.guided_choice), ("guided_grammar", self.guided_grammar),
            ("structured_outputs", self.structured_outputs),
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
        if self.structured_outputs is not None:
            return self.structured_outputs.params()
        if "response_format" not in given:
            return None
        assert self.response_format is not None
        return self.response_format.params()

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
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs are not available when stream is true")
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens must be -1 or at least 1")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of is not supported (as in vLLM V1): it may only equal n "
                             f"({self.n}), got {self.best_of}")
        for name, fine, why in VLLM_REFUSED:
            if getattr(self, name) not in fine:
                raise ValueError(f"{name}: {why}")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingRequest):
    # One prompt (text or token ids) or a batch of them.
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default; None: the rest of the context
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None  # OpenAI's; refused (as vLLM does)
    add_special_tokens: bool = True  # a text prompt gets the tokenizer's BOS (vLLM's default)
    # vLLM's extension (with --enable-prompt-embeds): one prompt, or a batch, given as
    # embeddings - each base64 of a safetensors file holding one [num_tokens, hidden_size]
    # tensor (see octavo.entrypoints.openai.prompt_embeds); prompt must then be "".
    prompt_embeds: str | list[str] | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.suffix is not None:
            raise ValueError("suffix is not supported")
        return self


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
    reasoning: str | None = None  # an assistant's earlier reasoning (vLLM's field)
    reasoning_content: str | None = None  # its older name

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template expects it."""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": self.text}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if reasoning is not None:
            message["reasoning_content"] = reasoning  # the name templates read
        return message


class FunctionDefinition(OpenAIRequest):
    name: str = Field(min_length=1, max_length=256)
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


class ChatTemplateFields(OpenAIRequest):
    """vLLM's fields for the chat template (chat completions and /tokenize)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the reply continues the last (assistant) message
    documents: list[dict[str, str]] | None = None  # for retrieval-augmented templates
    chat_template: str | None = None  # needs --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the template

    @model_validator(mode="after")
    def _check_template(self) -> ChatTemplateFields:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both "
                             "be true")
        return self


class ChatCompletionRequest(SamplingRequest, ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # deprecated by OpenAI for the next one
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ChatTool] | None = None
    # None: "auto" when tools are given (OpenAI's default), else "none". "auto" needs the
    # server's --enable-auto-tool-choice and a --tool-call-parser.
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # False: "required" makes exactly one call
    add_special_tokens: bool = False  # the template already writes BOS and the like
    include_reasoning: bool = True  # False: the reply's reasoning is not sent
    # A template variable, as vLLM passes it (gpt-oss templates read it).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None

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
        names = [tool.function.name for tool in self.tools]
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names the function {choice.function.name!r}, "
                             f"which is not among the tools ({', '.join(names)})")
        return self

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        """OpenAI's default: "auto" with tools, "none" without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def forced_tools(self) -> list[FunctionDefinition]:
        """The functions the reply must call one or more of (empty: a normal reply)."""
        choice = self.effective_tool_choice
        if not self.tools or choice in ("none", "auto"):
            return []
        if isinstance(choice, NamedToolChoice):
            return [t.function for t in self.tools if t.function.name == choice.function.name]
        return [t.function for t in self.tools]


class TokenizeRequest(ChatTemplateFields):
    """vLLM's /tokenize: a ``prompt`` as is, or ``messages`` (and ``tools``) through the
    chat template."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None  # None: True with ``prompt``, False with messages
    messages: list[ChatMessage] | None = None
    tools: list[ChatTool] | None = None

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
    token_logprobs: list[float | None] = Field(default_factory=list)  # None: an echoed
    tokens: list[str] = Field(default_factory=list)  # prompt's first token
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)

    def followed_by(self, other: CompletionLogprobs, shift: int) -> CompletionLogprobs:
        """These logprobs, then ``other``'s, whose text starts ``shift`` characters on."""
        return CompletionLogprobs(
            text_offset=[*self.text_offset, *(offset + shift for offset in other.text_offset)],
            token_logprobs=[*self.token_logprobs, *other.token_logprobs],
            tokens=[*self.tokens, *other.tokens],
            top_logprobs=[*self.top_logprobs, *other.top_logprobs])


class PromptLogprob(BaseModel):
    """vLLM's ``prompt_logprobs`` entry: one candidate token at one prompt position."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per prompt position: token id (as a string key) -> its logprob; None for the first.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's extension: the stop string or token id
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's, with prompt_logprobs
    prompt_token_ids: list[int] | None = None  # vLLM's, with return_token_ids
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids


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
    reasoning: str | None = None  # vLLM's, with --reasoning-parser
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's, with prompt_logprobs
    prompt_token_ids: list[int] | None = None  # vLLM's, with return_token_ids


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
    reasoning: str | None = None  # vLLM's, with --reasoning-parser
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids: this chunk's


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
    root: str  # the model file or folder served (a LoRA adapter's folder)
    parent: str | None = None  # a LoRA adapter's base model (vLLM's field); None: a base
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
