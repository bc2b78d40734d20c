"""Chat templates: which template turns a conversation into the prompt, and rendering it so
that nothing a client sends can reach past it.

The template is ``--chat-template`` (a file, or the template text itself, as vLLM takes it),
else the model's own (``tokenizer_config.json``, or a GGUF's ``tokenizer.chat_template``). A
request may bring its own (``chat_template``) only when the server trusts them
(``--trust-request-chat-template``, vLLM's flag): a template is a program.

Rendering goes through HF transformers' ``apply_chat_template``, whose Jinja environment is
an ``ImmutableSandboxedEnvironment`` (no ``__class__``, ``__globals__``, ``__init__`` or any
other underscore attribute; no mutation of the data it is given). Whatever fails while a
template renders a client's conversation, tools, documents or ``chat_template_kwargs`` - a
``raise_exception`` in the template, a tool schema of the wrong shape, a sandbox refusal -
is that client's 400, naming the template line; never a 500.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import jinja2.parser
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from octavo.entrypoints.openai.errors import OpenAIError
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
    environment = ImmutableSandboxedEnvironment(
        extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    try:
        environment.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"--chat-template {value[:80]!r}: {exc.message} (line "
                                f"{exc.lineno})") from None
    return template


class _GenerationBlock(Extension):
    """Parses HF's ``{% generation %}...{% endgeneration %}`` (which transformers' own
    environment knows), so that a template using it passes the start-up check."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


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
        text = tokenizer.apply_chat_template(
            messages, chat_template=template, tools=how.tools, documents=how.documents,
            add_generation_prompt=how.add_generation_prompt,
            continue_final_message=how.continue_final_message, tokenize=False, **how.kwargs)
    except RecursionError:
        raise OpenAIError(400, "the request is nested too deeply for the chat template",
                          param="messages") from None
    except Exception as exc:  # the client's data made the template fail: never a 500
        raise OpenAIError(400, f"the chat template cannot render these messages: "
                               f"{_describe(exc)}", param="messages") from None
    if not isinstance(text, str):
        raise OpenAIError(400, "the chat template did not render text", param="messages")
    return text


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
