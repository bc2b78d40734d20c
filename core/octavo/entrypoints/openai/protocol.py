"""Request and response bodies of the OpenAI-compatible API (pydantic), in OpenAI's shapes.

Requests take OpenAI's fields plus vLLM's common sampling extensions (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``priority``). Ranges are checked
here, so an out-of-range value is a 400 that names the field. A field this server does not
implement (``best_of``, ``tools``, ...) is rejected rather than silently ignored, unless it
is null: some clients send every field, null when unused.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_LOGPROBS = 20  # as OpenAI and vLLM's default max_logprobs


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _reject_unsupported_fields(self) -> OpenAIRequest:
        unsupported = [k for k, v in (self.model_extra or {}).items() if v is not None]
        if unsupported:
            raise ValueError(f"unsupported field {unsupported[0]!r}: this server does not "
                             "implement it")
        return self


class StreamOptions(OpenAIRequest):
    include_usage: bool = False


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


class TextPart(OpenAIRequest):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIRequest):
    # "developer" is OpenAI's newer name for "system".
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def template_dict(self) -> dict[str, str]:
        """The message as a chat template expects it."""
        if isinstance(self.content, list):
            content = "\n".join(part.text for part in self.content)
        else:
            content = self.content or ""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # deprecated by OpenAI for the next one
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self


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
    content: str


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


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


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


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: Any = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
