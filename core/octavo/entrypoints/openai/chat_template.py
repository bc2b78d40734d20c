"""Chat templates: which template turns a conversation into the prompt, and rendering it so
that nothing a client sends can reach past it.

The template is ``--chat-template`` (a file, or the template text itself, as vLLM takes it),
else the model's own (``tokenizer_config.json``, or a GGUF's ``tokenizer.chat_template``). A
request may bring its own (``chat_template``) only when the server trusts them
(``--trust-request-chat-template``, vLLM's flag): a template is a program.

Rendering does what HF transformers' ``apply_chat_template`` does, in the environment of
``template_sandbox``: transformers' ``ImmutableSandboxedEnvironment`` (no ``__class__``,
``__globals__``, ``__init__`` or any other underscore attribute; no mutation of the data it
is given) with the cost of a render bounded too (length of what it makes, steps, time).
Whatever fails while a template renders a client's conversation, tools, documents or
``chat_template_kwargs`` - a ``raise_exception`` in the template, a tool schema of the wrong
shape, a sandbox refusal, a limit - is that client's 400, naming the template line or the
limit; never a 500.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.template_sandbox import (
    TemplateLimitError,
    compile_template,
    render_template,
)
from octavo.sampling_params import check_text

# What tells a template apart from a path (vLLM's rule): a path has none of these.
_TEMPLATE_CHARS = "{}\n"
# apply_chat_template's own keywords: chat_template_kwargs must not reach them (``tokenize``
# would change what it returns), nor the variables the server sets itself.
RESERVED_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "processor_kwargs"})


# transformers' marker for continue_final_message: where the final message ends.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# The names a message's reasoning goes by, the standard one first (transformers' order).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A ``--chat-template`` that cannot be used (start-up)."""


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: the template text, read from the file it names unless it is the
    text itself; checked to compile, so a broken one fails the start naming its line."""
    if value is None:
        return None
    if any(char in value for char in _TEMPLATE_CHARS):
        template = value
    else:
        try:
            template = Path(value).read_text()
        except OSError as exc:
            raise ChatTemplateError(f"--chat-template {value!r} looks like a file path, but it "
                                    f"cannot be read: {exc.strerror}") from None
    try:
        compile_template(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"--chat-template {value[:80]!r}: {exc.message} (line "
                                f"{exc.lineno})") from None
    return template


def check_start_template(tokenizer: Any, server_template: str | None) -> None:
    """At start: the template the server renders with (``--chat-template``, else the
    model's) must compile and render a one-message conversation within its limits; a
    ``ChatTemplateError`` in one line otherwise. Errors a template raises on purpose
    (``raise_exception``) depend on the conversation and are left to the requests."""
    template = server_template or getattr(tokenizer, "chat_template", None)
    if not template:
        return
    try:
        _render_conversation(tokenizer, template, [{"role": "user", "content": "Hi"}],
                             ChatRender())
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template cannot be parsed: {exc.message} (line "
                                f"{exc.lineno})") from None
    except TemplateLimitError as exc:
        raise ChatTemplateError(f"the chat template cannot be used: {exc}") from None
    except Exception:  # noqa: BLE001 (the conversation's fault, not the template's)
        return


def render_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The prompt of ``messages`` through the model's own template (``octavo generate`` and
    ``chat``), with the bounds of a server's render; ``ChatTemplateError`` in one line."""
    try:
        return render(tokenizer, None, messages, ChatRender())
    except OpenAIError as exc:
        raise ChatTemplateError(exc.message) from None


@dataclass
class ChatRender:
    """What one request asks of the template, besides its messages."""

    tools: list[dict[str, Any]] | None = None  # OpenAI ``{"type": "function", ...}`` dicts
    documents: list[dict[str, str]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    template: str | None = None  # the request's own (already allowed by the caller)


def render(tokenizer: Any, server_template: str | None, messages: list[dict[str, Any]],
           how: ChatRender) -> str:
    """The prompt text of ``messages`` (400 with the reason when they cannot be rendered)."""
    template = how.template or server_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise OpenAIError(400, "this model has no chat template: start the server with "
                               "--chat-template, or use /v1/completions", param="messages")
    reserved = sorted(RESERVED_KWARGS & set(how.kwargs))
    if reserved:
        raise OpenAIError(400, f"chat_template_kwargs may not set {', '.join(reserved)}",
                          param="chat_template_kwargs")
    try:
        check_text("messages", json.dumps([messages, how.tools, how.documents, how.kwargs],
                                          ensure_ascii=False))
    except ValueError as exc:  # a lone surrogate: the tokenizer would raise a TypeError
        raise OpenAIError(400, str(exc), param="messages") from None
    try:
        text = _render_conversation(tokenizer, template, messages, how)
    except TemplateLimitError as exc:  # the template, not the request's data: name the limit
        raise OpenAIError(400, str(exc), param="chat_template") from None
    except RecursionError:
        raise OpenAIError(400, "the request is nested too deeply for the chat template",
                          param="messages") from None
    except Exception as exc:  # the client's data made the template fail: never a 500
        raise OpenAIError(400, f"the chat template cannot render these messages: "
                               f"{_describe(exc)}", param="messages") from None
    if not isinstance(text, str):
        raise OpenAIError(400, "the chat template did not render text", param="messages")
    return text


def _render_conversation(tokenizer: Any, template: str | dict[str, str],
                         messages: list[dict[str, Any]], how: ChatRender) -> str:
    """What transformers' ``apply_chat_template(..., tokenize=False)`` renders - the
    tokenizer's special tokens, keys set to None dropped, the reasoning under each name
    templates read it by, ``continue_final_message``'s cut - but in the bounded sandbox."""
    source = tokenizer.get_chat_template(template, how.tools)
    conversation = [_template_message(message) for message in messages]
    tag = _CONTINUE_TAG if how.continue_final_message else ""
    if tag:
        if how.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt do not go "
                             "together")
        final = conversation[-1].get("content") if conversation else None
        if not isinstance(final, str) or "content" not in source:
            raise ValueError("continue_final_message needs a final message with text "
                             "content that the template renders")
        conversation[-1]["content"] = final + tag
    text = render_template(source, {
        **tokenizer.special_tokens_map, **how.kwargs, "messages": conversation,
        "tools": how.tools, "documents": how.documents,
        "add_generation_prompt": how.add_generation_prompt})
    if not tag:
        return text
    if str(final).strip() not in text or tag.strip() not in text:
        raise ValueError("continue_final_message: the template dropped part of the final "
                         "message")
    at = text.rindex(tag.strip())
    return text[:at] if text[at:at + len(tag)] == tag else text[:at].rstrip()


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as transformers hands it to templates: no None values, and its reasoning
    under each name templates read (``reasoning_content``, gpt-oss's ``thinking``)."""
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _describe(exc: Exception) -> str:
    """The error and the template line it happened on, when the traceback knows it."""
    message = str(getattr(exc, "message", None) or exc).splitlines()[0] if str(exc) else ""
    detail = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    line = getattr(exc, "lineno", None) if isinstance(exc, jinja2.TemplateSyntaxError) \
        else _template_line(exc)
    return f"{detail} (template line {line})" if line else detail


def _template_line(exc: BaseException) -> int | None:
    """Jinja rewrites tracebacks so that template code shows as ``<template>`` frames with
    the template's line numbers: the innermost such frame."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if frame.filename == "<template>"]
    return frames[-1].lineno if frames else None


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them: an assistant's earlier calls with their
    ``arguments`` as an object, not JSON text (Hermes, Qwen and Llama templates ``tojson``
    them), as vLLM passes them."""
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            try:
                arguments = json.loads(function.get("arguments", ""))
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(arguments, dict):
                function["arguments"] = arguments
    return messages
