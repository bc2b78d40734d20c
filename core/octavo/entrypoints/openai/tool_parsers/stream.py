"""``ToolCallStream``: a reply's tool calls streamed as OpenAI streams them - the content as
it comes, then for each call one delta with its index, id, type and name (and empty
arguments), followed by the arguments in fragments that concatenate to its JSON text."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.entrypoints.openai.protocol import DeltaFunctionCall, DeltaToolCall
from octavo.entrypoints.openai.tool_parsers.base import ToolParser


@dataclass
class ToolCallStream:
    parser: ToolParser
    content_sent: int = 0
    ids: list[str] = field(default_factory=list)  # of the calls begun so far
    arguments_sent: list[int] = field(default_factory=list)

    def step(self, text: str, final: bool) -> tuple[str, list[DeltaToolCall]]:
        """What is new in the reply whose text is now ``text``: content, and call deltas."""
        parsed = self.parser.parse(text, final)
        content = parsed.content[self.content_sent:]
        self.content_sent = max(self.content_sent, len(parsed.content))
        deltas: list[DeltaToolCall] = []
        for index, call in enumerate(parsed.calls):
            if call.name is None:
                break
            if index == len(self.ids):
                self.ids.append(self.parser.new_call_id())
                self.arguments_sent.append(0)
                deltas.append(DeltaToolCall(index=index, id=self.ids[index], type="function",
                                            function=DeltaFunctionCall(name=call.name,
                                                                       arguments="")))
            if call.quoted and not call.done:
                continue  # JSON inside a string: sent whole once decoded
            fragment = call.arguments[self.arguments_sent[index]:]
            if fragment:
                deltas.append(DeltaToolCall(index=index,
                                            function=DeltaFunctionCall(arguments=fragment)))
                self.arguments_sent[index] = len(call.arguments)
        return content, deltas

    @property
    def called(self) -> bool:
        return bool(self.ids)
