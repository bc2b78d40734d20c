"""Llama 3.1/3.2/3.3's JSON tool calls (``tool_chat_template_llama3.1_json.jinja``):
``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several
separated by ``;``."""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import CallText, ToolParser, call_from_object
from octavo.entrypoints.openai.tool_parsers.json_scan import object_members, skip_space

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    start = ('{"name"', PYTHON_TAG)
    call_format = ('{"name": "{name}", "parameters": ', "}")

    def read_calls(self, text: str, start: int) -> list[CallText]:
        index = start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start
        calls: list[CallText] = []
        while (index := skip_space(text, index)) < len(text):
            members, end = object_members(text, index)
            calls.append(call_from_object(text, members, end is not None))
            if end is None:
                return calls
            index = skip_space(text, end)
            if not text.startswith(";", index):
                return calls  # what follows the calls is not shown
            index += 1
        return calls or [CallText(None)]
