"""The limits on a constraint's size and a schema's depth: checked
before xgrammar, whose time grows about as the cube of a schema's depth, so a schema nested
hundreds of levels is refused in microseconds rather than compiled for seconds."""

from __future__ import annotations

import time
from typing import Any

import pytest

from octavo.engine.errors import InvalidRequestError
from octavo.engine.processor import check_structured
from octavo.sampling_params import StructuredOutputsParams
from octavo.structured.grammar import MAX_SCHEMA_DEPTH, MAX_SPEC_BYTES, json_depth, validate


def nested_objects(levels: int) -> dict[str, Any]:
    """Objects in objects: two JSON levels each (the schema, then its "properties")."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def nested_arrays(levels: int) -> dict[str, Any]:
    """Arrays of arrays: one JSON level each."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("value, depth", [
    (3, 0), ("text", 0), ({}, 1), ([], 1), ({"a": [1, {"b": None}]}, 3),
    ([[[]], {"x": {"y": {}}}], 4), (nested_objects(3), 7), (nested_arrays(5), 5),
])
def test_json_depth(value: Any, depth: int) -> None:
    assert json_depth(value, limit=100) == depth


def test_json_depth_stops_counting_past_the_limit_and_never_recurses() -> None:
    deep: list[Any] = []
    for _ in range(100_000):  # far deeper than Python's recursion limit
        deep = [deep]
    assert json_depth(deep, limit=10) == 11


def test_a_schema_at_the_depth_limit_is_checked_by_xgrammar() -> None:
    validate(StructuredOutputsParams(json=nested_arrays(MAX_SCHEMA_DEPTH)))
    with pytest.raises(ValueError, match='Unsupported type "nonsense"'):
        validate(StructuredOutputsParams(json={"items": nested_arrays(MAX_SCHEMA_DEPTH - 2),
                                               "type": "nonsense"}))


@pytest.mark.timed
@pytest.mark.parametrize("schema", [nested_arrays(MAX_SCHEMA_DEPTH + 1), nested_objects(470)])
def test_a_deeper_schema_is_refused_before_xgrammar_sees_it(schema: dict[str, Any]) -> None:
    start = time.monotonic()
    with pytest.raises(InvalidRequestError,
                       match=f"^structured json: .* more than {MAX_SCHEMA_DEPTH} levels deep "
                             f"\\(the limit is {MAX_SCHEMA_DEPTH}\\)$"):
        check_structured(StructuredOutputsParams(json=schema))
    assert time.monotonic() - start < 0.1  # xgrammar takes seconds on 470 levels


def long_schema(num_bytes: int) -> dict[str, Any]:
    """A flat object schema whose compact JSON is exactly ``num_bytes`` long."""
    schema: dict[str, Any] = {"type": "object", "description": ""}
    padding = num_bytes - len(StructuredOutputsParams(json=schema).spec)
    schema["description"] = "x" * padding
    return schema


@pytest.mark.parametrize("kind, spec_of", [
    ("json", long_schema),
    ("regex", lambda n: "é" * (n // 2) + "a" * (n % 2)),  # UTF-8 bytes count
    ("grammar", lambda n: 'root ::= "' + "a" * (n - 11) + '"'),
    ("choice", lambda n: ["a" * (n - 4)]),
])
def test_a_constraint_longer_than_the_limit_is_refused(kind: str, spec_of: Any) -> None:
    at_limit = StructuredOutputsParams(**{kind: spec_of(MAX_SPEC_BYTES)})
    assert len(at_limit.spec.encode()) == MAX_SPEC_BYTES
    validate(at_limit)
    over = StructuredOutputsParams(**{kind: spec_of(MAX_SPEC_BYTES + 1)})
    with pytest.raises(ValueError, match=f"^structured {kind}: {MAX_SPEC_BYTES + 1} bytes long "
                                         f".*more than the limit of {MAX_SPEC_BYTES} bytes$"):
        validate(over)
