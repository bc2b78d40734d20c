"""From a constraint to an xgrammar grammar: the one place that knows how each kind of
``StructuredOutputsParams`` is spelled for xgrammar.

A constraint is named by ``(kind, spec)`` (``StructuredOutputsParams.kind`` and ``.spec``):
plain strings, so they key caches and travel anywhere.

JSON is generated compact (no free whitespace between tokens): a small model allowed any
whitespace may loop on newlines until it runs out of tokens, and compact JSON is also
fewer tokens.

The front end checks every constraint against the limits below before xgrammar sees it.
A thread running xgrammar cannot be stopped, so these limits are what bounds the check's
time; vLLM has none. Measured with xgrammar 0.2.9 (``Grammar.from_json_schema``, which
releases the GIL): its time grows about as the cube of the nesting depth - objects nested
32 levels (JSON depth 64) 0.005 s, arrays nested 64 levels 0.012 s, but objects nested 128
levels 0.19 s and 300 levels 2.5 s - and linearly with size: 128 KiB of schema, regex or
grammar takes 0.005-0.03 s. OpenAI itself allows 10 levels of nested objects.
"""

from __future__ import annotations

import functools
import json
import re

import xgrammar as xgr

from octavo.sampling_params import StructuredOutputsParams

# xgrammar prefixes its C++ errors with a timestamp and a source location.
_XGRAMMAR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_ANY_OBJECT = '{"type": "object"}'
# The character class xgrammar (0.2.8) gives strings with minLength/maxLength admits raw
# control characters, which JSON forbids (its unbounded strings exclude them).
_LAX_STRING_CHAR = r'[^\"\\\r\n]'
_JSON_STRING_CHAR = r'[^\0-\x1f\"\\]'
# How deeply a JSON schema may nest JSON objects and arrays: an object property's schema is
# two levels below its object's (the schema, then its "properties"), an array's items one.
MAX_SCHEMA_DEPTH = 64
# The longest constraint, in UTF-8 bytes of its spec (a schema as compact JSON): enough for
# OpenAI's own budget (120,000 characters of names and enum values) or 128 tools.
MAX_SPEC_BYTES = 128 * 1024
# The levels a structural tag may add around the schemas it holds (sequences, tags, ...).
STRUCTURAL_TAG_DEPTH = 16


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly ``choices`` (JSON string literals are valid
    xgrammar EBNF literals, escapes included)."""
    return "root ::= " + " | ".join(json.dumps(choice) for choice in choices)


def build_grammar(kind: str, spec: str) -> xgr.Grammar:
    """The grammar of a constraint, without a tokenizer: cheap, and it rejects every
    malformed schema, regex or grammar. Raises ``ValueError`` naming the kind and the
    problem."""
    try:
        if kind in ("json", "json_object"):
            return _json_schema_grammar(spec if kind == "json" else _ANY_OBJECT)
        if kind == "regex":
            return xgr.Grammar.from_regex(spec)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(json.loads(spec)))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(spec)
        if kind == "structural_tag":
            return _structural_tag_grammar(json.loads(spec))
    except RuntimeError as exc:  # xgrammar's errors (structural tags' too) are RuntimeErrors
        raise ValueError(f"structured {kind}: {_clean(exc)}") from None
    raise ValueError(f"unknown kind of structured output {kind!r}")


def _structural_tag_grammar(tag: dict[str, object]) -> xgr.Grammar:
    """xgrammar's structural tag (its ``format`` form, or the older ``structures`` and
    ``triggers`` form vLLM also takes), each JSON schema in it generated compact as above."""
    if "structures" in tag:
        tag = legacy_structural_tag(tag)
    if not isinstance(tag.get("format"), dict):
        raise ValueError('structured structural_tag: needs "format" (or "structures" and '
                         '"triggers")')
    return xgr.Grammar.from_structural_tag(
        json.dumps({"type": "structural_tag", "format": _compact_json(tag["format"])}))


def legacy_structural_tag(tag: dict[str, object]) -> dict[str, object]:
    """``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`` in xgrammar's
    current ``format`` form."""
    structures = tag.get("structures")
    if not isinstance(structures, list) or not all(isinstance(s, dict) for s in structures):
        raise ValueError("structured structural_tag: structures must be a list of objects")
    tags = [{"type": "tag", "begin": s.get("begin"), "end": s.get("end"),
             "content": {"type": "json_schema", "json_schema": s.get("schema", True)}}
            for s in structures]
    return {"type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": tag.get("triggers"), "tags": tags}}


def _compact_json(node: object) -> object:
    """The format tree with each plain JSON-schema part replaced by the EBNF of our compact
    JSON (xgrammar's own allows any whitespace there)."""
    if isinstance(node, list):
        return [_compact_json(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and set(node) <= {"type", "json_schema", "style"} \
            and node.get("style", "json") == "json":
        schema = node.get("json_schema")
        text = _ANY_OBJECT if schema is True else json.dumps(schema)
        return {"type": "grammar", "grammar": str(_json_schema_grammar(text))}
    return {key: _compact_json(value) for key, value in node.items()}


def _json_schema_grammar(schema: str) -> xgr.Grammar:
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False)
    ebnf = str(grammar)
    if _LAX_STRING_CHAR not in ebnf:
        return grammar
    return xgr.Grammar.from_ebnf(ebnf.replace(_LAX_STRING_CHAR, _JSON_STRING_CHAR))


@functools.lru_cache(maxsize=256)
def _validate(kind: str, spec: str) -> None:
    build_grammar(kind, spec)


def validate(params: StructuredOutputsParams) -> None:
    """Raise ``ValueError`` unless the constraint is within the limits and xgrammar accepts it
    (the front end's check, so a bad one never reaches the engine). Cached: a batch with one
    schema checks it once."""
    kind = params.kind
    value = params.json if kind == "json" else params.structural_tag
    limit = MAX_SCHEMA_DEPTH + (STRUCTURAL_TAG_DEPTH if kind == "structural_tag" else 0)
    if value is not None and json_depth(value, limit) > limit:
        raise ValueError(f"structured {kind}: the schema nests JSON objects and arrays "
                         f"more than {limit} levels deep (the limit is {limit})")
    spec = params.spec
    size = len(spec.encode())
    if size > MAX_SPEC_BYTES:
        raise ValueError(f"structured {kind}: {size} bytes long (a schema counts as compact "
                         f"JSON), more than the limit of {MAX_SPEC_BYTES} bytes")
    _validate(kind, spec)


def json_depth(value: object, limit: int) -> int:
    """How deeply ``value`` nests JSON objects and arrays (a scalar: 0), counted up to just
    past ``limit``: iteratively, so that no value is too deep to measure."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _clean(exc: Exception) -> str:
    return _XGRAMMAR_PREFIX.sub("", str(exc)).strip()
