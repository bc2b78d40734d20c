"""A streamed response as OpenAI's typed events: each output item (reasoning, message,
function call) is announced (``response.output_item.added``), filled by deltas
(``response.reasoning_text.delta``, ``response.output_text.delta``,
``response.function_call_arguments.delta``), closed (``...done`` and
``response.output_item.done``) before the next one opens, and the whole response comes last
(``response.completed``, or ``response.incomplete``)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from octavo.entrypoints.openai.protocol import DeltaMessage, DeltaToolCall
from octavo.entrypoints.openai.responses_protocol import (
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
)


@dataclass
class EventWriter:
    """Turns a reply's stream deltas into events; ``items`` holds the output so far."""

    items: list[OutputItem] = field(default_factory=list)
    _open: OutputItem | None = None
    _calls: dict[int, OutputFunctionCall] = field(default_factory=dict)  # by delta index
    _sequence: Iterator[int] = field(default_factory=itertools.count)

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": next(self._sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def feed(self, delta: DeltaMessage) -> Iterator[str]:
        if delta.reasoning:
            yield from self._text(OutputReasoning, "response.reasoning_text.delta",
                                  delta.reasoning)
        if delta.content:
            yield from self._text(OutputMessage, "response.output_text.delta", delta.content)
        for call in delta.tool_calls or []:
            yield from self._call(call)

    def close(self) -> Iterator[str]:
        """Close the item still open (the reply is complete)."""
        item, self._open = self._open, None
        if item is None:
            return
        index = self.items.index(item)
        item.status = "completed"
        if isinstance(item, OutputFunctionCall):
            yield self.event("response.function_call_arguments.done", item_id=item.id,
                             output_index=index, name=item.name, arguments=item.arguments)
        else:
            part = item.content[0]
            kind = "reasoning_text" if isinstance(item, OutputReasoning) else "output_text"
            yield self.event(f"response.{kind}.done", item_id=item.id, output_index=index,
                             content_index=0, text=part.text,
                             **({"logprobs": []} if kind == "output_text" else {}))
            if isinstance(item, OutputMessage):
                yield self.event("response.content_part.done", item_id=item.id,
                                 output_index=index, content_index=0, part=part.model_dump())
        yield self.event("response.output_item.done", output_index=index,
                         item=item.model_dump())

    def _open_item(self, item: OutputItem) -> Iterator[str]:
        yield from self.close()
        self._open = item
        self.items.append(item)
        announced = item.model_copy(update={"status": "in_progress"}, deep=True)
        if not isinstance(announced, OutputFunctionCall):
            announced.content = []
        yield self.event("response.output_item.added", output_index=len(self.items) - 1,
                         item=announced.model_dump())

    def _text(self, kind: type[OutputReasoning] | type[OutputMessage], event: str,
              text: str) -> Iterator[str]:
        if not isinstance(self._open, kind):
            part: OutputText | ReasoningText = (ReasoningText(text="") if kind is OutputReasoning
                                                else OutputText(text=""))
            opened = kind(content=[part])  # type: ignore[list-item]
            yield from self._open_item(opened)
            if kind is OutputMessage:
                yield self.event("response.content_part.added", item_id=opened.id,
                                 output_index=len(self.items) - 1, content_index=0,
                                 part=part.model_dump())
        item = self._open
        assert item is not None and not isinstance(item, OutputFunctionCall)
        item.content[0].text += text
        yield self.event(event, item_id=item.id, output_index=len(self.items) - 1,
                         content_index=0, delta=text,
                         **({"logprobs": []} if kind is OutputMessage else {}))

    def _call(self, call: DeltaToolCall) -> Iterator[str]:
        if call.index not in self._calls:
            item = OutputFunctionCall(call_id=call.id or "", name=call.function.name or "",
                                      arguments="")
            self._calls[call.index] = item
            yield from self._open_item(item)
        item = self._calls[call.index]
        fragment = call.function.arguments or ""
        if fragment:
            item.arguments += fragment
            yield self.event("response.function_call_arguments.delta", item_id=item.id,
                             output_index=self.items.index(item), delta=fragment)
