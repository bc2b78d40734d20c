"""Tool calling: the constraint a request's ``tool_choice`` puts on the reply, and the
calls read back out of a reply that was forced to make them.

- a named function: the output is that function's arguments, one JSON object;
- ``"required"``: the output is a JSON array of ``{"name": ..., "parameters": {...}}``, each
  item one of the tools (vLLM's format), at least one call;
- ``"auto"`` (with ``--enable-auto-tool-choice``): the text is free until the model opens a
  call in its format (the ``--tool-call-parser``'s start marker); from there the call is held
  to one of the tools and its parameter schema, by the parser's structural tag;
- ``"none"``: no constraint, and no calls are read.
"""

from __future__ import annotations

import json
import uuid

from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    FunctionCall,
    FunctionDefinition,
    NamedToolChoice,
    ToolCall,
)
from octavo.entrypoints.openai.tool_parsers import ToolParser
from octavo.sampling_params import StructuredOutputsParams


def tool_call_constraint(request: ChatCompletionRequest,
                         parser: ToolParser | None) -> StructuredOutputsParams | None:
    """The constraint ``tool_choice`` puts on the reply; None: none. ``parser``: the
    server's tool-call parser when auto tool choice is enabled."""
    choice = request.effective_tool_choice
    if choice == "none" or not request.tools:
        return None
    if choice == "auto":
        if parser is None:
            raise OpenAIError(400, '"auto" tool choice (the default when tools are given) '
                                   "needs the server started with --enable-auto-tool-choice "
                                   'and --tool-call-parser; or send tool_choice "required", '
                                   '"none" or a named function', param="tool_choice")
        tag = parser.structural_tag([tool.function.model_dump() for tool in request.tools])
        return None if tag is None else StructuredOutputsParams(structural_tag=tag)
    tools = request.forced_tools
    if isinstance(choice, NamedToolChoice):
        return StructuredOutputsParams(json=tools[0].parameters)
    return StructuredOutputsParams(
        json=required_calls_schema(tools, parallel=request.parallel_tool_calls))


def required_calls_schema(tools: list[FunctionDefinition], parallel: bool,
                          ) -> dict[str, object]:
    """An array of one call (several when ``parallel``), each of one of ``tools``."""
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [tool.name]},
                             "parameters": tool.parameters},
              "required": ["name", "parameters"]} for tool in tools]
    schema: dict[str, object] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_forced_calls(request: ChatCompletionRequest, text: str) -> list[ToolCall] | None:
    """The calls in a finished reply to a request that forced tools; None when the text is
    not complete JSON (the reply hit max_tokens)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    choice = request.effective_tool_choice
    if isinstance(choice, NamedToolChoice):
        return [ToolCall(id=new_call_id(),
                         function=FunctionCall(name=choice.function.name, arguments=text))]
    return [ToolCall(id=new_call_id(),
                     function=FunctionCall(name=item["name"],
                                           arguments=json.dumps(item["parameters"])))
            for item in value]
