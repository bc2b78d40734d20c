"""From the text a model wrote to the chat reply a client gets: its reasoning (with
``--reasoning-parser``), its content and its tool calls (``tool_choice`` forced, or "auto"
with the ``--tool-call-parser``) - whole, or as stream deltas.

The reasoning comes first: the parser splits it off at ``</think>``; only the answer after
it can hold content or tool calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.engine.outputs import CompletionOutput
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
)
from octavo.entrypoints.openai.reasoning_parsers import Opening, ReasoningParser, Split
from octavo.entrypoints.openai.tool_calls import new_call_id, parse_forced_calls
from octavo.entrypoints.openai.tool_parsers import ToolParser
from octavo.entrypoints.openai.tool_parsers.stream import ToolCallStream


@dataclass
class Reply:
    content: str | None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ReplyReader:
    """How to read the replies to one request."""

    request: ChatCompletionRequest
    reasoning: ReasoningParser | None = None
    opening: Opening = Opening.ANSWER  # where the replies start (the rendered prompt)
    tools: ToolParser | None = None  # reads "auto" calls

    def split(self, text: str, final: bool) -> Split:
        if self.reasoning is None:
            return Split(None, text)
        split = self.reasoning.split(text, self.opening, final)
        return split if self.request.include_reasoning else Split(None, split.content)

    @property
    def auto_tools(self) -> ToolParser | None:
        auto = self.request.tools and self.request.effective_tool_choice == "auto"
        return self.tools if auto else None

    def reply(self, completion: CompletionOutput) -> Reply:
        """The whole reply of a finished completion."""
        split = self.split(completion.text, final=True)
        content = split.content
        if self.request.forced_tools:
            calls = (parse_forced_calls(self.request, content or "")
                     if completion.finish_reason == "stop" else None)
            if calls is not None:
                return Reply(None, split.reasoning, calls)
        elif self.auto_tools is not None and content is not None:
            parsed = self.auto_tools.parse(content, final=True)
            calls = [ToolCall(id=self.auto_tools.new_call_id(),
                              function=FunctionCall(name=call.name or "",
                                                    arguments=call.arguments))
                     for call in parsed.calls]
            if calls:
                return Reply(parsed.content if parsed.content.strip() else None,
                             split.reasoning, calls)
        return Reply(content, split.reasoning)

    def finish_reason(self, completion: CompletionOutput, called: bool) -> str | None:
        """OpenAI's "tool_calls" for a complete reply that calls tools."""
        if called and completion.finish_reason == "stop":
            return "tool_calls"
        return completion.finish_reason

    def stream(self) -> ReplyStream:
        auto = self.auto_tools
        return ReplyStream(self, ToolCallStream(auto) if auto is not None else None)


@dataclass
class ReplyStream:
    """One choice's reply as stream deltas."""

    reader: ReplyReader
    tool_stream: ToolCallStream | None = None
    reasoning_sent: int = 0
    content_sent: int = 0
    forced_call_id: str | None = None
    forced_calls: list[ToolCall] = field(default_factory=list)

    @property
    def called(self) -> bool:
        if self.tool_stream is not None:
            return self.tool_stream.called
        return bool(self.forced_call_id or self.forced_calls)

    def delta(self, completion: CompletionOutput) -> DeltaMessage | None:
        """What is new in the reply since the last delta (None: nothing to show yet)."""
        final = completion.finished()
        split = self.reader.split(completion.text, final)
        reasoning = (split.reasoning or "")[self.reasoning_sent:]
        self.reasoning_sent += len(reasoning)
        content, calls = self._answer(split.content or "", completion)
        if not (reasoning or content or calls):
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None,
                            tool_calls=calls or None)

    def _answer(self, text: str, completion: CompletionOutput,
                ) -> tuple[str, list[DeltaToolCall]]:
        request = self.reader.request
        if self.tool_stream is not None:
            return self.tool_stream.step(text, completion.finished())
        if request.forced_tools:
            return self._forced(text, completion)
        content = text[self.content_sent:]
        self.content_sent = len(text)
        return content, []

    def _forced(self, text: str, completion: CompletionOutput,
                ) -> tuple[str, list[DeltaToolCall]]:
        """A named function: its arguments as they come (the first delta names the call);
        "required": every call once the reply is complete (its array is parsed whole)."""
        request = self.reader.request
        choice = request.effective_tool_choice
        if isinstance(choice, NamedToolChoice):
            fragment = text[self.content_sent:]
            self.content_sent = len(text)
            if self.forced_call_id is None:
                self.forced_call_id = new_call_id()
                return "", [DeltaToolCall(index=0, id=self.forced_call_id, type="function",
                                          function=DeltaFunctionCall(name=choice.function.name,
                                                                     arguments=fragment))]
            return "", ([DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=fragment))]
                        if fragment else [])
        if not completion.finished():
            return "", []
        calls = parse_forced_calls(request, text) if completion.finish_reason == "stop" else None
        if calls is None:
            return text, []
        self.forced_calls = calls
        return "", [DeltaToolCall(index=i, id=call.id, type="function",
                                  function=DeltaFunctionCall(name=call.function.name,
                                                             arguments=call.function.arguments))
                    for i, call in enumerate(calls)]
