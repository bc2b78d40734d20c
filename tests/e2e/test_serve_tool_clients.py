"""Real agent clients, unchanged, against ``octavo serve`` with automatic tool choice: the
default model (SmolLM2-135M-Instruct) behind the tool-aware template shipped in examples/
and the hermes parser - LangChain's ``bind_tools``, the OpenAI Agents SDK through
``/v1/responses`` and through chat completions, and the ``openai`` SDK streaming a call.

The 135M model does not open a tool call on its own. The conversations here lead it there
the way any prompt may: a system prompt and two worked examples in the history (a question,
the call, the tool's result, the answer), each rendered by the template exactly as the
parser's structural tag writes a call. Greedy decoding makes the rest deterministic; once the
model writes ``<tool_call>``, the grammar holds the call to the tool's schema (``maxLength``
below), so the arguments validate whatever the model would have written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

from .server import Server

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "chat_templates" / "tool_chat_template_smollm2_hermes.jinja"
MODEL = "SmolLM2-135M-Instruct"
SYSTEM = "You answer every question by calling a function."
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"]}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "parameters": CITY}}
EXAMPLES = [("Paris", "sunny, 21 C", "It is sunny in Paris."),
            ("Oslo", "cold, 2 C", "It is cold in Oslo.")]
GREEDY = {"temperature": 0.0, "max_tokens": 40}


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["--chat-template", str(TEMPLATE), "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--max-model-len", "1024",
            "--kv-cache-memory", "48MiB", "--max-stored-responses", "4"]
    with Server(args, tmp_path_factory.mktemp("tool-server") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def tool_client(tool_server: Server) -> OpenAI:
    return OpenAI(base_url=f"{tool_server.url}/v1", api_key="none", max_retries=0, timeout=120)


def chat_history(question: str) -> list[dict[str, Any]]:
    """The system prompt, the worked examples, then ``question`` (OpenAI chat messages)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for index, (city, result, answer) in enumerate(EXAMPLES):
        call_id = f"call_example_{index}"
        messages += [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "assistant", "content": answer}]
    return [*messages, {"role": "user", "content": question}]


def responses_history(question: str) -> list[dict[str, Any]]:
    """The worked examples, then ``question``, as Responses API input items (the system
    prompt goes as ``instructions``)."""
    items: list[dict[str, Any]] = []
    for index, (city, result, answer) in enumerate(EXAMPLES):
        items += [{"role": "user", "content": f"Weather in {city}?"},
                  {"type": "function_call", "call_id": f"call_example_{index}",
                   "name": "get_weather", "arguments": json.dumps({"city": city})},
                  {"type": "function_call_output", "call_id": f"call_example_{index}",
                   "output": result},
                  {"role": "assistant", "content": answer}]
    return [*items, {"role": "user", "content": question}]


def test_langchain_bind_tools_two_turn_loop(tool_server: Server) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=f"{tool_server.url}/v1", api_key="none",
                     temperature=0, max_tokens=40, max_retries=0)
    bound = llm.bind_tools([WEATHER_TOOL])  # the default tool choice: "auto"
    messages: list[Any] = [SystemMessage(SYSTEM)]
    for index, (city, result, answer) in enumerate(EXAMPLES):
        messages += [HumanMessage(f"Weather in {city}?"),
                     AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": city},
                                                "id": f"call_example_{index}"}]),
                     ToolMessage(result, tool_call_id=f"call_example_{index}"),
                     AIMessage(answer)]
    messages.append(HumanMessage("Weather in Rome?"))
    called = bound.invoke(messages)
    assert len(called.tool_calls) == 1, called
    call = called.tool_calls[0]
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], CITY)
    messages += [called, ToolMessage("rainy, 15 C", tool_call_id=call["id"])]
    answer = bound.invoke(messages)
    assert not answer.tool_calls and answer.content.strip(), answer


def test_openai_agents_sdk_runs_a_tool_through_both_apis(tool_server: Server) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would send traces to OpenAI
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        cities.append(city)
        return "rainy, 15 C"

    async def run(model_class: Any) -> str:
        client = AsyncOpenAI(base_url=f"{tool_server.url}/v1", api_key="none", max_retries=0)
        agent = Agent(name="weather", instructions=SYSTEM, tools=[get_weather],
                      model=model_class(model=MODEL, openai_client=client),
                      model_settings=ModelSettings(temperature=0, max_tokens=40))
        result = await Runner.run(agent, input=responses_history("Weather in Rome?"),
                                  max_turns=4)
        return str(result.final_output)

    for model_class in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        cities.clear()
        final = asyncio.run(run(model_class))
        assert cities and all(len(city) <= 20 for city in cities), (model_class, cities)
        assert final.strip(), (model_class, final)


def test_openai_sdk_streams_a_tool_call_as_openai_does(tool_client: OpenAI) -> None:
    chunks = list(tool_client.chat.completions.create(
        model=MODEL, messages=chat_history("Weather in Rome?"), tools=[WEATHER_TOOL],
        stream=True, **GREEDY))
    deltas = [call for chunk in chunks for choice in chunk.choices
              for call in choice.delta.tool_calls or []]
    assert deltas, [c.model_dump() for c in chunks]
    first, rest = deltas[0], deltas[1:]
    assert first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    arguments = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), CITY)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    whole = tool_client.chat.completions.create(
        model=MODEL, messages=chat_history("Weather in Rome?"), tools=[WEATHER_TOOL], **GREEDY)
    assert whole.choices[0].message.tool_calls[0].function.arguments == arguments


def test_text_stays_free_until_a_call_opens(tool_client: OpenAI) -> None:
    """Without the examples the model answers in prose: the structural tag leaves text
    alone (and tool_choice "none" reads no calls at all)."""
    for tool_choice in (openai.NOT_GIVEN, "none"):
        reply = tool_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me about Rome."}],
            tools=[WEATHER_TOOL], tool_choice=tool_choice, temperature=0.0, max_tokens=12)
        message = reply.choices[0].message
        assert not message.tool_calls and len(message.content) > 20, message


def test_responses_stream_store_and_continue(tool_client: OpenAI) -> None:
    tools = [{"type": "function", **WEATHER_TOOL["function"]}]
    events = []
    with tool_client.responses.stream(model=MODEL, instructions=SYSTEM, tools=tools,
                                 input=responses_history("Weather in Rome?"), temperature=0,
                                 max_output_tokens=40) as stream:
        events = [event.type for event in stream]
        called = stream.get_final_response()
    assert events[:3] == ["response.created", "response.in_progress",
                          "response.output_item.added"], events
    assert "response.function_call_arguments.delta" in events
    assert events[-3:] == ["response.function_call_arguments.done",
                           "response.output_item.done", "response.completed"], events
    call = called.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), CITY)
    answer = tool_client.responses.create(
        model=MODEL, previous_response_id=called.id, tools=tools, temperature=0,
        max_output_tokens=40,
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": "rainy, 15 C"}])
    assert answer.output_text.strip() and answer.previous_response_id == called.id
    assert tool_client.responses.retrieve(called.id).output[0].call_id == call.call_id
    unstored = tool_client.responses.create(model=MODEL, input="Hi", max_output_tokens=2,
                                            store=False)
    for attempt in (lambda: tool_client.responses.retrieve(unstored.id),
                    lambda: tool_client.responses.create(model=MODEL, input="Hi",
                                                    previous_response_id=unstored.id)):
        with pytest.raises(openai.NotFoundError):
            attempt()
    for _ in range(4):  # --max-stored-responses 4: the oldest goes first
        tool_client.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        tool_client.responses.retrieve(called.id)
