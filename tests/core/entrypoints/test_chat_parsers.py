"""The OpenAI server's tool-call and reasoning parsers, without a server: each format read
whole and streamed, streamed deltas that add up to the whole (cut at every character), and
the structural tags they constrain output with, held against xgrammar's own matcher."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from octavo.entrypoints.openai.protocol import DeltaToolCall
from octavo.entrypoints.openai.reasoning_parsers import (
    Opening,
    get_reasoning_parser,
    reasoning_parser_names,
)
from octavo.entrypoints.openai.tool_parsers import get_tool_parser, tool_parser_names
from octavo.entrypoints.openai.tool_parsers.stream import ToolCallStream
from octavo.sampling_params import StructuredOutputsParams
from octavo.structured.grammar import build_grammar

WEATHER = {"name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
# (parser, model text, content, [(name, arguments)])
FORMATS = [
    ("hermes", 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris"}}\n</tool_call><tool_call>{"name": "now", "arguments": {}}'
               "</tool_call>",
     "Let me check. ", [("get_weather", '{"city": "Paris"}'), ("now", "{}")]),
    ("hermes", '<tool_call>{"arguments": "{\\"city\\": \\"Oslo\\"}", "name": "get_weather"}'
               "</tool_call>", "", [("get_weather", '{"city": "Oslo"}')]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}; '
                    '{"name": "now", "parameters": {}}',
     "", [("get_weather", '{"city": "Rome"}'), ("now", "{}")]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Bern"}}, '
                '{"name": "now", "arguments": {}}]',
     "", [("get_weather", '{"city": "Bern"}'), ("now", "{}")]),
    ("mistral", 'Sure[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}', "Sure",
     [("get_weather", '{"city": "Nice"}')]),
    ("pythonic", '[get_weather(city="Lima", days=2), now()]', "",
     [("get_weather", '{"city": "Lima", "days": 2}'), ("now", "{}")]),
]
PLAIN = ["The weather is fine.", "a < b and [1, 2]", "<tool_call>{\"name\": 5}</tool_call>"]


def test_the_builtin_parsers_are_registered() -> None:
    assert set(tool_parser_names()) >= {"hermes", "llama3_json", "mistral", "pythonic"}
    assert set(reasoning_parser_names()) >= {"deepseek_r1", "qwen3"}
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'; choose from hermes"):
        get_tool_parser("nope")


@pytest.mark.parametrize(("name", "text", "content", "calls"), FORMATS,
                         ids=[f"{f[0]}-{i}" for i, f in enumerate(FORMATS)])
def test_calls_read_whole_and_streamed(name: str, text: str, content: str,
                                       calls: list[tuple[str, str]]) -> None:
    parser = get_tool_parser(name)
    parsed = parser.parse(text, final=True)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    streamed_content, deltas = "", []
    stream = ToolCallStream(parser)
    for end in range(1, len(text) + 1):  # the text as it grows, a character at a time
        new_content, new_deltas = stream.step(text[:end], end == len(text))
        streamed_content += new_content
        deltas += new_deltas
    assert streamed_content == content
    assert streamed_calls(deltas) == calls


def streamed_calls(deltas: list[DeltaToolCall]) -> list[tuple[str, str]]:
    """OpenAI's rule: a call's first delta has its id and name, the rest only arguments."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.index not in calls:
            assert delta.id and delta.type == "function" and delta.function.name
            assert delta.function.arguments == ""
            calls[delta.index] = [delta.function.name, ""]
        else:
            assert delta.id is None and delta.function.name is None
            calls[delta.index][1] += delta.function.arguments or ""
    return [(name, arguments) for name, arguments in calls.values()]


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral", "pythonic"])
@pytest.mark.parametrize("text", PLAIN)
def test_text_that_is_not_calls_is_content(name: str, text: str) -> None:
    parsed = get_tool_parser(name).parse(text, final=True)
    assert (parsed.content, parsed.calls) == (text, [])


def test_a_call_cut_short_is_content_and_a_marker_is_held_back() -> None:
    parser = get_tool_parser("hermes")
    cut = '<tool_call>{"name": "get_weather", "argu'
    assert parser.parse(cut, final=True).content == cut
    assert parser.parse("Hello <tool_c", final=False).content == "Hello "
    assert parser.parse("Hello <tool_c", final=True).content == "Hello <tool_c"


def test_mistral_ids_are_nine_letters_or_digits() -> None:
    call_id = get_tool_parser("mistral").new_call_id()
    assert len(call_id) == 9 and call_id.isalnum()


def matches(constraint: StructuredOutputsParams, text: str) -> bool:
    """Whether xgrammar's matcher takes all of ``text`` and may end there."""
    info = xgr.TokenizerInfo([chr(i) for i in range(32, 127)])  # any vocabulary will do
    grammar = xgr.GrammarCompiler(info).compile_grammar(
        build_grammar(constraint.kind, constraint.spec))
    matcher = xgr.GrammarMatcher(grammar)
    return matcher.accept_string(text) and matcher.is_completed()


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_structural_tags_free_text_until_a_call_then_hold_it_to_the_schema(name: str) -> None:
    parser = get_tool_parser(name)
    tag = StructuredOutputsParams(structural_tag=parser.structural_tag([WEATHER]))
    begin, end = parser.call_format or ("", "")
    call = begin.replace("{name}", "get_weather")
    assert matches(tag, "Any text at all, ")
    assert matches(tag, f'Sure. {call}{{"city": "Paris"}}{end}')
    assert not matches(tag, f'Sure. {call}{{"town": "Paris"}}{end}')  # not the schema
    assert not matches(tag, call.replace("get_weather", "other") + '{"city": "x"}' + end)
    assert parser.parse(f'{call}{{"city": "Paris"}}{end}', final=True).calls[0].arguments == \
        '{"city": "Paris"}'


def test_pythonic_calls_are_not_constrained() -> None:
    assert get_tool_parser("pythonic").structural_tag([WEATHER]) is None


@pytest.mark.parametrize(("name", "text", "opening", "reasoning", "content"), [
    ("qwen3", "<think>Sum it.</think>It is 4.", Opening.MAY_THINK, "Sum it.", "It is 4."),
    ("qwen3", "Sum it.</think>It is 4.", Opening.IN_REASONING, "Sum it.", "It is 4."),
    ("qwen3", "It is 4.", Opening.MAY_THINK, None, "It is 4."),
    ("qwen3", "<think>x</think>y", Opening.ANSWER, None, "<think>x</think>y"),
    ("qwen3", "<think>Still thinking", Opening.MAY_THINK, "Still thinking", None),
    ("deepseek_r1", "Sum it.</think>It is 4.", Opening.IN_REASONING, "Sum it.", "It is 4."),
    ("deepseek_r1", "<think>Sum it.</think>It is 4.", Opening.IN_REASONING, "Sum it.",
     "It is 4."),
])
def test_reasoning_split(name: str, text: str, opening: Opening, reasoning: str | None,
                         content: str | None) -> None:
    parser = get_reasoning_parser(name)
    split = parser.split(text, opening, final=True)
    assert (split.reasoning, split.content) == (reasoning, content)
    shown_reasoning = shown_content = ""
    for end in range(1, len(text) + 1):  # streamed: what is shown only grows
        part = parser.split(text[:end], opening, final=end == len(text))
        assert (part.reasoning or "").startswith(shown_reasoning)
        assert (part.content or "").startswith(shown_content)
        shown_reasoning, shown_content = part.reasoning or "", part.content or ""
    assert (shown_reasoning, shown_content) == (reasoning or "", content or "")


def test_where_replies_start() -> None:
    qwen3, r1 = get_reasoning_parser("qwen3"), get_reasoning_parser("deepseek_r1")
    assert qwen3.opening("<|user|>Hi <think>x</think><|assistant|>") is Opening.MAY_THINK
    assert qwen3.opening("<|assistant|><think>\n") is Opening.IN_REASONING
    assert qwen3.opening("<|assistant|><think>\n\n</think>\n\n") is Opening.ANSWER
    assert r1.opening("<|assistant|>") is Opening.IN_REASONING


@pytest.mark.parametrize("constraint", [
    StructuredOutputsParams(choice=["yes", "no"]), StructuredOutputsParams(regex="[0-9]+"),
    StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}},
                                  "required": ["a"]}),
    StructuredOutputsParams(grammar='root ::= "ok"')])
def test_guided_decoding_holds_the_answer_only(constraint: StructuredOutputsParams) -> None:
    answer = {"choice": "yes", "regex": "42", "json": '{"a": 1}', "grammar": "ok"}[
        constraint.kind]
    parser = get_reasoning_parser("qwen3")
    thinking = parser.answer_only(constraint, Opening.IN_REASONING)
    assert matches(thinking, f"anything {{at}} all</think>{answer}")
    assert not matches(thinking, f"anything</think>not {answer}")
    may = parser.answer_only(constraint, Opening.MAY_THINK)
    assert matches(may, f"<think>free</think>{answer}") and matches(may, answer)
    assert parser.answer_only(constraint, Opening.ANSWER) is constraint
    json.dumps(thinking.structural_tag)  # it travels to the engine as JSON
