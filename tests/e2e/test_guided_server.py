"""Guided decoding through ``octavo serve`` with the official ``openai`` client (tiny random
model: whatever it says, the constraint must hold): response_format json_schema and
json_object, guided_regex / guided_choice / guided_grammar, tool calls with tool_choice set
to a named function or "required" (streamed too), and 400s for bad constraints that leave
the server serving."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from openai import OpenAI

from .conftest import TinyModel

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "pets": {"type": "array", "items": {"enum": ["cat", "dog"]},
                                  "maxItems": 3}},
          "required": ["name", "age", "pets"]}
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 16},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                                  "maximum": 14}},
        "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "Tell me about the weather."}]


@pytest.fixture(scope="module")
def model(tiny_model: TinyModel) -> str:
    return str(tiny_model.folder)


def validate(instance: object, schema: dict) -> None:
    """``jsonschema.validate`` with string lengths as the grammar counts them. The random
    tiny model can emit a UTF-8 sequence cut short by its next byte token; xgrammar counts
    such a sequence as one character, the decoder turns each of its bytes into U+FFFD
    (seen in CI: 12 characters to the grammar, 14 decoded). Lengths on real text are
    checked on SmolLM2 in test_guided_smollm2.py."""
    jsonschema.validate(_collapse_replacements(instance), schema)


def _collapse_replacements(value: object) -> object:
    if isinstance(value, str):
        return re.sub("\ufffd+", "\ufffd", value)
    if isinstance(value, dict):
        return {k: _collapse_replacements(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_collapse_replacements(v) for v in value]
    return value

def test_response_format_json_schema(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, n=4, temperature=1.0, max_tokens=200, seed=1,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON}})
    for choice in reply.choices:
        assert choice.finish_reason == "stop", f"model seed {tiny_model.seed}: {choice}"
        validate(json.loads(choice.message.content), PERSON)
    anything = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=200,
                                              temperature=0.0,
                                              response_format={"type": "json_object"})
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_guided_extensions(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    regex = r"[A-Z][a-z]{1,5}-\d{2}"
    completion = client.completions.create(model=model, prompt="Code:", n=4, max_tokens=20,
                                           temperature=1.0, extra_body={"guided_regex": regex})
    for choice in completion.choices:
        assert re.fullmatch(regex, choice.text), f"model seed {tiny_model.seed}: {choice.text!r}"
    choice = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=10, temperature=1.0,
        extra_body={"guided_choice": ["sunny", "rainy"]})
    assert choice.choices[0].message.content in ("sunny", "rainy")
    grammar = client.completions.create(model=model, prompt="x", max_tokens=10,
                                        extra_body={"guided_grammar": 'root ::= "a"+ "b"'})
    assert re.fullmatch("a+b", grammar.choices[0].text)
    schema = client.completions.create(model=model, prompt="x", max_tokens=200,
                                       extra_body={"guided_json": json.dumps(TIME)})
    jsonschema.validate(json.loads(schema.choices[0].text), TIME)


def _check_calls(calls, names: set[str], seed: int) -> None:  # type: ignore[no-untyped-def]
    assert calls, f"model seed {seed}: no tool call"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_and_required_tool_calls(client: OpenAI, model: str,
                                       tiny_model: TinyModel) -> None:
    named = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=1.0, n=2,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    for choice in named.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check_calls(choice.message.tool_calls, {"get_weather"}, tiny_model.seed)
        assert len(choice.message.tool_calls) == 1
    # One call each: a random model may add parallel calls past any token limit.
    required = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS,
                                              max_tokens=300, temperature=1.0, n=3,
                                              tool_choice="required", parallel_tool_calls=False)
    for choice in required.choices:
        assert choice.finish_reason == "tool_calls", f"model seed {tiny_model.seed}"
        _check_calls(choice.message.tool_calls, set(SCHEMAS), tiny_model.seed)
        assert len(choice.message.tool_calls) == 1


@pytest.mark.parametrize("tool_choice", [
    {"type": "function", "function": {"name": "get_time"}}, "required"])
def test_streamed_tool_calls(client: OpenAI, model: str, tiny_model: TinyModel,
                             tool_choice: object) -> None:
    stream = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS,
                                            tool_choice=tool_choice, max_tokens=300,
                                            temperature=0.0, stream=True,
                                            parallel_tool_calls=False)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls", f"model seed {tiny_model.seed}"
    assert calls
    for entry in calls.values():
        assert entry["id"].startswith("call_")
        allowed = set(SCHEMAS) if tool_choice == "required" else {"get_time"}
        assert entry["name"] in allowed
        validate(json.loads(entry["arguments"]), SCHEMAS[entry["name"]])


@pytest.mark.parametrize("body, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}},
     'structured json: Unsupported type "nope"'),
    ({"extra_body": {"guided_regex": "(unclosed"}}, "structured regex: Regex parsing error"),
    ({"extra_body": {"guided_grammar": "root ::= missing"}},
     'structured grammar: .*Rule "missing" is not defined'),
    ({"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}},
     "at most one output constraint, got guided_regex, guided_choice"),
    # "auto" (the default with tools) needs --enable-auto-tool-choice, which this server
    # lacks: tests/e2e/test_serve_tool_clients.py serves it.
    ({"tools": TOOLS}, '"auto" tool choice .* needs the server started with '
                       "--enable-auto-tool-choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "names the function 'other', which is not among the tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot also follow response_format"),
])
def test_bad_constraints_are_400_and_the_server_goes_on(client: OpenAI, model: str,
                                                        body: dict, message: str) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, **body)
    assert error.value.status_code == 400
    assert re.search(message, error.value.body["message"]), error.value.body
    # ignore_eos: the random tiny model may sample EOS within 3 tokens.
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
