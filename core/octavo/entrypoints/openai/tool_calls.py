"""Tool calling with ``tool_choice`` set to a named function or ``"required"``: the reply is
constrained to the tools' parameter schemas, so its arguments always parse and validate.

- a named function: the output is that function's arguments, one JSON object;
- ``"required"``: the output is a JSON array of ``{"name": ..., "parameters": {...}}``, each
  item one of the tools (vLLM's format), at least one call.
"""

from __future__ import annotations

import json
import uuid

from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    FunctionCall,
    FunctionDefinition,
    NamedToolChoice,
    ToolCall,
)
from octavo.sampling_params import StructuredOutputsParams


def tool_call_constraint(request: ChatCompletionRequest) -> StructuredOutputsParams | None:
    """The constraint that makes the reply a call of the forced tools; None: no tool is
    forced."""
    tools = request.forced_tools
    if not tools:
        return None
    if isinstance(request.tool_choice, NamedToolChoice):
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


def parse_tool_calls(request: ChatCompletionRequest, text: str) -> list[ToolCall] | None:
    """The calls in a finished reply to a request that forced tools; None when the text is
    not complete JSON (the reply hit max_tokens)."""
    if isinstance(request.tool_choice, NamedToolChoice):
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return None
        name = request.tool_choice.function.name
        return [ToolCall(id=new_call_id(), function=FunctionCall(name=name, arguments=text))]
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return None
    return [ToolCall(id=new_call_id(),
                     function=FunctionCall(name=item["name"],
                                           arguments=json.dumps(item["parameters"])))
            for item in items]
