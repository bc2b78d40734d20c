"""``StructuredOutputsParams``: exactly one constraint, checked at once; the front end's
xgrammar check names what is wrong; the params survive the trip to the engine core."""

from __future__ import annotations

import json

import pytest

from octavo.engine.serial import Decoder, Encoder, RequestKind
from octavo.request import Request
from octavo.sampling_params import SamplingParams, StructuredOutputsParams
from octavo.structured.grammar import validate

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
          "required": ["b", "a"]}


def test_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match="exactly one of .*; got none"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="got json, regex"):
        StructuredOutputsParams(json=SCHEMA, regex="a+")
    with pytest.raises(ValueError, match="choice must be a non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="regex must be a non-empty string"):
        StructuredOutputsParams(regex=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="json is not valid JSON"):
        StructuredOutputsParams(json="{not json")
    with pytest.raises(ValueError, match="must be a JSON schema object"):
        StructuredOutputsParams(json="[1, 2]")


def test_kind_and_spec_keep_the_schema_key_order() -> None:
    params = StructuredOutputsParams(json='{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert params.kind == "json"
    assert params.spec == '{"type":"object","properties":{"b":{},"a":{}}}'
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    assert StructuredOutputsParams(choice=["x", "y"]).spec == '["x", "y"]'


def test_sampling_params_take_a_dict_and_expose_structured() -> None:
    params = SamplingParams(structured_outputs={"regex": "[0-9]+"})
    assert params.structured == StructuredOutputsParams(regex="[0-9]+")
    assert SamplingParams().structured is None


@pytest.mark.parametrize("params, message", [
    (StructuredOutputsParams(json={"type": "nonsense"}),
     'structured json: Unsupported type "nonsense"'),
    (StructuredOutputsParams(json={"type": "integer", "minimum": 5, "maximum": 1}),
     "structured json: Invalid range: minimum greater than maximum"),
    (StructuredOutputsParams(regex="[a-z"),
     "structured regex: Regex parsing error at position 5: Unclosed '\\['"),
    (StructuredOutputsParams(grammar="root ::= item"),
     'structured grammar: .*Rule "item" is not defined'),
])
def test_validation_names_the_problem(params: StructuredOutputsParams, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        validate(params)


def test_valid_constraints_pass() -> None:
    for params in (StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(json_object=True),
                   StructuredOutputsParams(regex=r"\d{3}"), StructuredOutputsParams(
                       choice=['say "hi"', "back\\slash", "naïve"]),
                   StructuredOutputsParams(grammar='root ::= "a" root | "b"')):
        validate(params)


def test_params_cross_the_engine_core_wire() -> None:
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA))
    request = Request("r", [1, 2, 3], params)
    kind, decoded = Decoder(RequestKind).decode(Encoder().encode(RequestKind.ADD, request))
    assert kind is RequestKind.ADD
    assert decoded.sampling_params.structured_outputs == params.structured_outputs
    assert decoded.sampling_params.structured_outputs.spec == params.structured_outputs.spec


def test_length_bounded_json_strings_exclude_control_characters() -> None:
    """xgrammar 0.2.8 lets minLength/maxLength strings hold raw control characters, which
    JSON forbids; the grammar built here does not."""
    import xgrammar as xgr

    from octavo.structured.grammar import build_grammar
    from tests.core.tiny_models import VOCAB_SIZE, tiny_tokenizer

    info = xgr.TokenizerInfo.from_huggingface(tiny_tokenizer(), vocab_size=VOCAB_SIZE)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    for schema in ({"type": "string", "maxLength": 4}, {"type": "string", "minLength": 1}):
        grammar = compiler.compile_grammar(build_grammar("json", json.dumps(schema)))
        assert xgr.GrammarMatcher(grammar).accept_string('"ab"')
        assert not xgr.GrammarMatcher(grammar).accept_string('"a\x1a')
