"""Mistral's tool calls: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}``
(v3 tokenizers, ``tool_chat_template_mistral.jinja``) or ``name[ARGS]{...}`` (v11+ ones).
Mistral's templates check that call ids are 9 letters or digits, so these ids are."""

from __future__ import annotations

import secrets
import string

from octavo.entrypoints.openai.tool_parsers.base import CallText, ToolParser, call_from_object
from octavo.entrypoints.openai.tool_parsers.json_scan import (
    NotJSON,
    object_members,
    skip_space,
    value_end,
)

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_ID_ALPHABET = string.ascii_letters + string.digits


class MistralToolParser(ToolParser):
    start = (TOOL_CALLS,)
    call_format = (TOOL_CALLS + '[{"name": "{name}", "arguments": ', "}]")

    def read_calls(self, text: str, start: int) -> list[CallText]:
        calls: list[CallText] = []
        index = start
        while (index := text.find(TOOL_CALLS, index)) >= 0:
            body = skip_space(text, index + len(TOOL_CALLS))
            if body >= len(text):
                return [*calls, CallText(None)]
            read = _array if text[body] == "[" else _named
            found, end = read(text, body)
            calls.extend(found)
            if end is None:
                break
            index = end
        return calls

    def new_call_id(self) -> str:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


def _array(text: str, index: int) -> tuple[list[CallText], int | None]:
    """``[{...}, {...}]`` from ``text[index]``; the index past it (None: unfinished)."""
    calls: list[CallText] = []
    index = skip_space(text, index + 1)
    while index < len(text) and text[index] != "]":
        members, end = object_members(text, index)
        calls.append(call_from_object(text, members, end is not None))
        if end is None:
            return calls, None
        index = skip_space(text, end)
        if text.startswith(",", index):
            index = skip_space(text, index + 1)
    return calls, (index + 1 if index < len(text) else None)


def _named(text: str, index: int) -> tuple[list[CallText], int | None]:
    """``name[ARGS]{...}`` from ``text[index]``."""
    marker = text.find(ARGS, index)
    if marker < 0:
        rest = text[index:]
        bracket = rest.find("[")
        if "{" in rest or (bracket >= 0 and not ARGS.startswith(rest[bracket:])):
            raise NotJSON("a call without [ARGS]")
        return [CallText(None)], None  # the name, and perhaps the start of [ARGS], so far
    name = text[index:marker].strip()
    start = skip_space(text, marker + len(ARGS))
    end = value_end(text, start)
    return [CallText(name, text[start:end], end is not None)], end
