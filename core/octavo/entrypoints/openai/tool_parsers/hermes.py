"""Hermes' tool calls (Qwen2.5, Qwen3, Hermes 2/3 and the SmolLM2 template in examples/):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call."""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import CallText, ToolParser, call_from_object
from octavo.entrypoints.openai.tool_parsers.json_scan import object_members, skip_space

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    start = (OPEN,)
    call_format = (OPEN + '\n{"name": "{name}", "arguments": ', "}\n" + CLOSE)

    def read_calls(self, text: str, start: int) -> list[CallText]:
        calls: list[CallText] = []
        index: int | None = start
        while index is not None and (index := text.find(OPEN, index)) >= 0:
            body = skip_space(text, index + len(OPEN))
            if body >= len(text):
                calls.append(CallText(None))  # opened, nothing written yet
                break
            members, end = object_members(text, body)
            calls.append(call_from_object(text, members, end is not None))
            index = end
        return calls
